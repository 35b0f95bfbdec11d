"""Memory and speed of reading torch.profiler (Kineto) traces, measured side by side.

Run alone: ``python -m benchmarks.bench_kineto`` (``--mb 1024`` for the full
1 GB check, ``--json`` for machine-readable output); ``make bench`` runs it
with the others.

Method: a synthetic Kineto trace of ``--mb`` megabytes is written (streamed to
disk, never held in memory) with the event mix of a real training step: a
``ProfilerStep``, a DataLoader span, an H2D copy, forward operators with
nested runtime launches and their kernels, backward on an autograd thread,
optimizer, ``ac2g`` flow events, and argument dictionaries of realistic size
(~300 bytes per event). Each measurement runs in a fresh child process that
reports its own peak resident set size (``VmHWM``; ``ru_maxrss`` where there is no /proc):

- ``baseline``: the child imports ``tlog.ingest.kineto`` and does nothing else;
- ``bare``: the child iterates the events with ``ijson.items`` (C backend)
  and drops them: the floor for any streaming reader;
- ``convert``: ``ingest.kineto.convert_trace`` on the file (read, map, records);
- ``json.load`` (only up to 256 MB): the whole document parsed at once, what
  a non-streaming reader would hold.

Two trace shapes are measured: ``gpu`` (the step above, ~300 bytes per event)
and ``cpu_ops`` (:func:`write_cpu_ops_trace`: a CPU-only job's profile, 4,000
small operators per step, all top-level on the stepping thread, ~130 bytes per
event: the most events, and the most top-level spans, a gigabyte can hold; a
1 GB file is ~2,000 steps and ~8M operators). ``convert`` of ``cpu_ops`` is
measured after ``gpu``'s; ``bare`` and ``json.load`` for ``gpu`` only.

Budget: a 1 GB trace is read within 2 GB of memory. The ratio
checked is ``(convert peak - baseline) / file size``, extrapolated to 1 GB and
added to the baseline, for each shape; exit status 1 if either exceeds 2 GB.
The speed ratio ``convert time / bare time`` is printed for reference (the
mapping's cost over the JSON parse alone).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._memory import PEAK_BYTES_SRC

#: Budget: peak memory for a 1 GB trace, bytes.
BUDGET_BYTES_PER_GB = 2 * 1024**3
GB = 1024**3
MB = 1024**2

#: Child programs: (set-up, timed part). Imports are not timed.
_CHILD = {
    "baseline": ("import tlog.ingest.kineto", "n = 0"),
    "bare": ("import ijson",
             ("n = 0\n"
              "with open(PATH, 'rb') as f:\n"
              "    for _ in ijson.items(f, 'traceEvents.item', use_float=True):\n"
              "        n += 1\n")),
    "convert": ("import tlog.ingest.kineto",
                ("c = tlog.ingest.kineto.convert_trace(PATH)\n"
                 "n = len(c.records)\n")),
    "json.load": ("import json",
                  ("with open(PATH, 'rb') as f:\n"
                   "    n = len(json.load(f)['traceEvents'])\n")),
}


def write_synthetic_trace(path: Path, target_bytes: int, *, ops_per_step: int = 400) -> dict[str, int]:
    """Write a Kineto-like trace of about ``target_bytes`` to ``path``.

    Returns counts: ``steps``, ``events``, ``bytes``.
    """
    pid, main, bwd = 4242, 4242, 4300
    corr = 1
    ts = 1_000_000.0
    steps = events = 0
    dumps = json.JSONEncoder(separators=(", ", ": ")).encode
    with path.open("w", encoding="utf-8") as f:
        f.write('{\n  "schemaVersion": 1,\n  "distributedInfo": {"backend": "nccl", "rank": 0, '
                '"world_size": 8},\n  "deviceProperties": [{"id": 0, "name": "synthetic"}],\n'
                '  "traceEvents": [\n')
        first = True

        def emit(ev: dict) -> None:
            nonlocal first, events
            f.write(("  " if first else ",\n  ") + dumps(ev))
            first = False
            events += 1

        while f.tell() < target_bytes:
            t0 = ts
            ext = steps * 10_000
            emit({"ph": "X", "cat": "user_annotation",
                  "name": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                  "pid": pid, "tid": main, "ts": t0 + 1, "dur": 2000.0,
                  "args": {"External id": ext + 1, "Record function id": 0}})
            t = t0 + 2010
            for k in range(ops_per_step):
                thread = main if k < ops_per_step // 2 else bwd
                name = "aten::linear" if thread == main else \
                    "autograd::engine::evaluate_function: AddmmBackward0"
                emit({"ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": thread,
                      "ts": t, "dur": 40.0,
                      "args": {"External id": ext + 10 + k, "Sequence number": corr,
                               "Fwd thread id": 0, "Input Dims": [[64, 1024], [1024, 1024], []],
                               "Input type": ["float", "float", "Scalar"]}})
                emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid,
                      "tid": thread, "ts": t + 10, "dur": 6.0,
                      "args": {"External id": ext + 10 + k, "cbid": 211, "correlation": corr}})
                emit({"ph": "s", "id": corr, "pid": pid, "tid": thread, "ts": t + 10,
                      "cat": "ac2g", "name": "ac2g"})
                emit({"ph": "X", "cat": "kernel",
                      "name": "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>"
                              "(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
                      "pid": 0, "tid": 7, "ts": t + 20, "dur": 30.0,
                      "args": {"External id": ext + 10 + k, "queued": 0, "device": 0, "context": 1,
                               "stream": 7, "correlation": corr, "registers per thread": 226,
                               "shared memory": 49152, "blocks per SM": 0.592593,
                               "warps per SM": 4.740741, "grid": [1, 8, 8], "block": [128, 1, 1],
                               "est. achieved occupancy %": 6}})
                emit({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": t + 20, "cat": "ac2g",
                      "name": "ac2g", "bp": "e"})
                corr += 1
                t += 50
            emit({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step",
                  "pid": pid, "tid": main, "ts": t, "dur": 500.0, "args": {"External id": ext + 9}})
            t += 510
            # The step span goes last, once its length is known (Kineto does not
            # sort events either).
            emit({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{steps}",
                  "pid": pid, "tid": main, "ts": t0, "dur": t - t0,
                  "args": {"External id": ext, "Ev Idx": events}})
            steps += 1
            ts = t + 100
        f.write('\n  ],\n  "traceName": "synthetic", "displayTimeUnit": "ms",\n'
                '  "baseTimeNanoseconds": 1700000000000000000\n}\n')
        size = f.tell()
    return {"steps": steps, "events": events, "bytes": size}


def write_cpu_ops_trace(path: Path, target_bytes: int, *, ops_per_step: int = 4000
                        ) -> dict[str, int]:
    """Write a CPU-only Kineto-like trace of about ``target_bytes`` to ``path``:
    steps of ``ops_per_step`` small operators (3.125 µs every 4 µs, each
    top-level) on one thread, each step's ``ProfilerStep`` span after its operators.

    Returns counts: ``steps``, ``events``, ``bytes``.
    """
    pid = tid = 4242
    ts = 1_000_000.0
    steps = events = 0
    op = ('{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": %d, "tid": %d, '
          '"ts": %.3f, "dur": 3.125, "args": {"External id": %d}}')
    step = ('{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d", "pid": %d, '
            '"tid": %d, "ts": %.3f, "dur": %.3f, "args": {"External id": %d}}')
    with path.open("w", encoding="utf-8") as f:
        f.write('{"schemaVersion": 1, "deviceProperties": [], "traceEvents": [\n')
        while f.tell() < target_bytes:
            t0 = t = ts
            parts = []
            for _ in range(ops_per_step):
                t += 1.0
                parts.append(op % (pid, tid, t, events))
                events += 1
                t += 3.0
            parts.append(step % (steps, pid, tid, t0, t + 1.0 - t0, events))
            events += 1
            f.write((",\n" if steps else "") + ",\n".join(parts))
            steps += 1
            ts = t + 10.0
        f.write('\n], "traceName": "synthetic-cpu", "baseTimeNanoseconds": 1700000000000000000}\n')
        size = f.tell()
    return {"steps": steps, "events": events, "bytes": size}


def _measure(kind: str, path: Path) -> dict[str, float]:
    setup, timed = _CHILD[kind]
    code = ("import resource, sys, time\n"
            f"{PEAK_BYTES_SRC}\n"
            f"PATH = {str(path)!r}\n"
            f"{setup}\n"
            "t = time.perf_counter()\n"
            f"{timed}\n"
            "dt = time.perf_counter() - t\n"
            "print(dt, _peak_bytes())\n")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         check=True, env={**os.environ, "PYTHONPATH": str(root)})
    dt, peak = out.stdout.split()
    return {"seconds": float(dt), "peak_bytes": int(peak)}


def _shape(kind: str, path: Path, target: int, base: int, extra: list[str]) -> dict[str, Any]:
    """Write one trace shape, measure ``convert`` (and ``extra`` readers) on it."""
    t = time.perf_counter()
    write = write_synthetic_trace if kind == "gpu" else write_cpu_ops_trace
    stats = write(path, target)
    gen_s = time.perf_counter() - t
    res = {k: _measure(k, path) for k in ["convert", *extra]}
    path.unlink()
    size = stats["bytes"]
    net = res["convert"]["peak_bytes"] - base
    projected = base + net / size * GB
    out: dict[str, Any] = {
        "trace_mb": round(size / MB, 1), "events": stats["events"], "steps": stats["steps"],
        "generate_s": round(gen_s, 2), "convert_s": round(res["convert"]["seconds"], 2),
        "convert_mb_per_s": round(size / MB / res["convert"]["seconds"], 1),
        "convert_peak_mb": round(res["convert"]["peak_bytes"] / MB, 1),
        "convert_net_peak_per_trace_byte": round(net / size, 3),
        "projected_peak_for_1gb_mb": round(projected / MB),
        "peak_over_budget": round(projected / BUDGET_BYTES_PER_GB, 3),
    }
    if "bare" in res:
        out["bare_s"] = round(res["bare"]["seconds"], 2)
        out["bare_peak_mb"] = round(res["bare"]["peak_bytes"] / MB, 1)
        out["convert_over_bare"] = round(res["convert"]["seconds"] / res["bare"]["seconds"], 2)
    if "json.load" in res:
        out["json_load_peak_mb"] = round(res["json.load"]["peak_bytes"] / MB, 1)
        out["json_load_net_over_convert_net"] = round(
            (res["json.load"]["peak_bytes"] - base) / max(net, 1), 1)
    out["ok"] = projected <= BUDGET_BYTES_PER_GB
    return out


def main(argv: list[str] | None = None) -> int:
    """Write synthetic traces, measure the readers, print ratios; 1 if over budget."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_kineto", description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=64, help="size of the synthetic traces (default 64)")
    ap.add_argument("--shape", choices=["gpu", "cpu_ops", "both"], default="both",
                    help="which trace shape (default both)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    shapes = ["gpu", "cpu_ops"] if args.shape == "both" else [args.shape]
    result: dict[str, Any] = {"budget_mb": BUDGET_BYTES_PER_GB // MB}
    with tempfile.TemporaryDirectory(prefix="tlog-bench-kineto-") as tmp:
        path = Path(tmp) / "synthetic.pt.trace.json"
        base = _measure("baseline", path)["peak_bytes"]
        result["baseline_peak_mb"] = round(base / MB, 1)
        for kind in shapes:
            extra = (["bare"] + (["json.load"] if args.mb <= 256 else [])) if kind == "gpu" else []
            result[kind] = _shape(kind, path, args.mb * MB, base, extra)
    ok = all(result[k]["ok"] for k in shapes)
    result["ok"] = ok
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for kind in shapes:
            r = result[kind]
            print(f"kineto trace reading, shape {kind} "
                  f"({r['trace_mb']} MB, {r['events']} events, {r['steps']} steps)")
            for k, v in r.items():
                print(f"  {k:34s} {v}")
            print(f"  {kind}: 1 GB trace within 2 GB: projected "
                  f"{r['projected_peak_for_1gb_mb']} MB / {result['budget_mb']} MB = "
                  f"{r['peak_over_budget']} -> " + ("ok" if r["ok"] else "MISSED"))
        print(f"  baseline_peak_mb                   {result['baseline_peak_mb']}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
