"""Noise profiles of real training steps, for the detection benchmark's simulated runs.

A profile holds, per measured rank, each step's seconds of ``data_wait``,
``forward``, ``backward`` (its own part: the exposed all-reduce wait taken
out), ``optimizer`` and the collective's transfer, each divided by that
rank's median (a relative deviation), plus the medians (``means_s``, the
seconds the simulation scales). :mod:`benchmarks._accuracy_sim` draws
blocks of these real steps for every simulated rank. Nothing of tlog reads
them here: the figures are the training script's own timers or the trace's
own events.

Two profiles, written to ``benchmarks/data/noise_profiles.json``
(docs/ACCURACY.md "Noise profiles"):

- ``gloo-cpu``: the real 2-rank gloo DDP job of the DDP scenarios
  (``tests/ddp/ddp_train.py --scenario healthy``, 150 steps, modes phases and
  measured, one torchrun) on a shared 2-core machine, read from its bare
  ``time.perf_counter()`` timers (``truth-rank{R}.json``; ``comm_wait_s`` is
  backward's return less the last DDP bucket ready). The transfer of a step
  is the smaller of the ranks' exposed waits (the last to arrive waits for
  the transfer only). The first 5 steps are warm-up and left out.
- ``gpu-traces``: public torch.profiler traces (/work/shared/traces,
  README.md there): the two ResNet-50-on-a-V100 samples with 4 loader
  workers (``kineto/profiler_api_nw4``, ``kineto/array_nw4``: per
  ``ProfilerStep`` the DataLoader ``__next__`` spans, ``Optimizer.step`` and
  ``Optimizer.zero_grad``, and the rest of the step as compute, split
  forward 1 : backward 2 with one deviation, tlog's choice: the traces time
  no forward span), the transfer's deviation from the NCCL kernels per step
  of the torchrec trace (``hta/trace_diff/control``); its mean is 10% of the
  ResNet step (a guess: these single-GPU samples have no collective).

Regenerate: ``python -m benchmarks._noise_profiles --ddp-truth DIR [DIR ...]
[--traces /work/shared/traces]`` (each DIR a ``truth/`` folder of a healthy
DDP run).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PROFILES = HERE / "data" / "noise_profiles.json"
#: Leading steps of a DDP run left out as warm-up (the DDP scenarios' own rule).
WARMUP_STEPS = 5
#: The simulated transfer's mean in the ``gpu-traces`` profile, as a share of
#: the step: a guess (DDP on NVLink spends a few to ~10% of a step exposed in
#: the all-reduce); its step-to-step deviation is measured.
GPU_TRANSFER_SHARE = 0.10
#: Forward's share of the compute of the ``gpu-traces`` steps (the rest is
#: backward): the usual 1 : 2, tlog's choice (the traces time no forward span).
GPU_FORWARD_SHARE = 1 / 3


def _relative(rows: list[list[float]]) -> tuple[list[float], list[list[float]]]:
    """Medians per column and each row divided by them (a column whose median
    is 0 keeps deviation 1)."""
    a = np.asarray(rows, dtype=float)
    med = np.median(a, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        dev = np.where(med > 0, a / np.where(med > 0, med, 1.0), 1.0)
    return med.tolist(), np.round(dev, 4).tolist()


def from_ddp_truth(truth_dirs: list[Path]) -> dict:
    """The ``gloo-cpu`` profile from the truth folders of healthy DDP runs."""
    series, means, hosts, sources = [], [], set(), []
    for d in truth_dirs:
        ranks = [json.loads(p.read_text()) for p in sorted(d.glob("truth-rank*.json"))]
        if len(ranks) < 2:
            raise SystemExit(f"{d}: needs the truth files of two ranks or more")
        steps = [t["per_step"][WARMUP_STEPS:] for t in ranks]
        n = min(len(s) for s in steps)
        transfer = [min(s[i]["comm_wait_s"] for s in steps) for i in range(n)]
        for t, s in zip(ranks, steps, strict=True):
            rows = [[st["data_s"], st["forward_s"], st["backward_s"] - st["comm_wait_s"],
                     st["optimizer_s"], transfer[i]] for i, st in enumerate(s[:n])]
            med, dev = _relative(rows)
            means.append(med)
            series.append(dev)
            hosts.add(t.get("host"))
        sources.append(f"mode {ranks[0].get('mode')}: {len(ranks)} ranks, {n} steps after "
                       f"{WARMUP_STEPS} warm-up")
    return {"source": "the real gloo DDP job of tests/ddp (ddp_train.py --scenario healthy "
                      "--mode phases,measured --steps 150, one torchrun, 2 ranks), its bare "
                      "timers; " + "; ".join(sources),
            "hosts": sorted(h for h in hosts if h),
            "means_s": [round(statistics.median(col), 6) for col in zip(*means, strict=True)],
            "series": series}


def _trace_steps(path: Path) -> list[dict]:
    """Per ``ProfilerStep`` span of the stepping thread: its seconds, the
    DataLoader ``__next__`` spans', the optimizer's, and the NCCL kernels' in it."""
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    steps = sorted((e for e in spans if str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    out = []
    for s in steps:
        a, b = s["ts"], s["ts"] + s["dur"]
        inside = [e for e in spans if a <= e.get("ts", -1) < b]
        own = [e for e in inside if e.get("tid") == s["tid"]]
        out.append({
            "step": s["dur"] / 1e6,
            "data": sum(e["dur"] for e in own if "DataLoader" in e["name"]
                        and "__next__" in e["name"]) / 1e6,
            "optimizer": sum(e["dur"] for e in own if e["name"].startswith(
                ("Optimizer.step#", "Optimizer.zero_grad#"))) / 1e6,
            "nccl": sum(e["dur"] for e in inside if e.get("cat") == "kernel"
                        and "nccl" in e["name"].lower()) / 1e6,
        })
    return out


def from_traces(root: Path) -> dict:
    """The ``gpu-traces`` profile from the public traces under ``root``."""
    compute_traces = [root / "kineto/profiler_api_nw4/worker0.pt.trace.json.gz",
                      root / "kineto/array_nw4/worker0.pt.trace.json.gz"]
    comm_trace = root / "hta/trace_diff/control/control.json.gz"
    comm = [s["nccl"] for s in _trace_steps(comm_trace)]
    comm_dev = [c / statistics.median(comm) for c in comm]
    series, means = [], []
    for path in compute_traces:
        steps = _trace_steps(path)
        rows = []
        for i, s in enumerate(steps):
            compute = s["step"] - s["data"] - s["optimizer"]
            rows.append([s["data"], compute * GPU_FORWARD_SHARE,
                         compute * (1 - GPU_FORWARD_SHARE), s["optimizer"],
                         comm_dev[i % len(comm_dev)]])
        med, dev = _relative(rows)
        step = statistics.median(s["step"] for s in steps)
        med[4] = GPU_TRANSFER_SHARE * step
        means.append(med)
        series.append(dev)
    return {"source": ("public torch.profiler traces (/work/shared/traces/README.md): "
                       + ", ".join(str(p.relative_to(root)) for p in compute_traces)
                       + f" (ResNet-50, one V100, 4 loader workers; {len(series[0])} "
                       f"profiled steps each); transfer deviation from the NCCL kernels "
                       f"per step of {comm_trace.relative_to(root)}, its mean "
                       f"{GPU_TRANSFER_SHARE:.0%} of the step (a guess)"),
            "means_s": [round(statistics.median(col), 6) for col in zip(*means, strict=True)],
            "series": series}


def main(argv: list[str] | None = None) -> int:
    """Measure both profiles and write :data:`PROFILES`."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks._noise_profiles")
    ap.add_argument("--ddp-truth", type=Path, nargs="+", required=True,
                    help="truth/ folders of healthy runs of tests/ddp/ddp_train.py")
    ap.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    ap.add_argument("--note", default="", help="what the machine was doing (load)")
    ap.add_argument("--out", type=Path, default=PROFILES)
    args = ap.parse_args(argv)
    gloo = from_ddp_truth(args.ddp_truth)
    if args.note:
        gloo["machine"] = args.note
    doc = {"columns": ["data_wait", "forward", "backward_own", "optimizer", "transfer"],
           "unit": "means_s in seconds; series: per rank, per step, seconds / that rank's median",
           "profiles": {"gloo-cpu": gloo, "gpu-traces": from_traces(args.traces)}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=None, separators=(",", ":")) + "\n")
    for name, p in doc["profiles"].items():
        print(f"{name}: means {[round(m * 1e3, 2) for m in p['means_s']]} ms, "
              f"{len(p['series'])} series x {len(p['series'][0])} steps")
    return 0


def load(path: Path = PROFILES) -> dict:
    """The profiles by name, as :class:`benchmarks._accuracy_sim.Profile`."""
    from benchmarks._accuracy_sim import Profile

    doc = json.loads(path.read_text())
    return {name: Profile(name=name, source=p["source"], means_s=tuple(p["means_s"]),
                          series=tuple(np.asarray(s, dtype=float) for s in p["series"]))
            for name, p in doc["profiles"].items()}


if __name__ == "__main__":
    sys.exit(main())
