"""How well tlog finds injected stragglers: precision, recall, F1 and the gain's error.

Run alone: ``python -m benchmarks accuracy`` (``python -m benchmarks.bench_accuracy
--seeds 2 --worlds 2 4 8 16 32 64``; ``--no-ddp``, ``--no-live`` leave out the
real jobs); ``make bench`` runs it with the others. docs/ACCURACY.md holds the
published figures, the method and the noise profiles' sources.

Three suites, each going through tlog's real ingest and diagnose
(:class:`tlog.api.Database`):

1. **Simulated lockstep runs** (:mod:`benchmarks._accuracy_sim`): world
   sizes 2 to 64, per-step noise drawn from measured profiles
   (:mod:`benchmarks._noise_profiles`), written as the shim writes them;
   half with the shim's measured all-reduce wait, half with the waits left
   to inference. Each run is healthy or has one fault: ``input`` (a slow
   loader), ``compute`` or ``comm`` (its side of the all-reduce) on a rank
   drawn at random, from a step drawn at random in the first half, of a
   size from 5% to 3x (+200%) of the healthy step.
2. **Real gloo DDP jobs** (tests/ddp: ``healthy``, ``input_straggler``,
   ``compute_straggler``, 2 ranks under torchrun, phases mode), scored
   against the jobs' bare timers (``tests/ddp/ddp_runs.Truth``).
3. **Time to detect, live** (:mod:`benchmarks.live_job`): real jobs of 3
   ranks beside a real ``tlog serve``; a rank starts straggling mid-run;
   seconds from the onset (the job's clock) until ``GET /api/runs/ID/live``
   names it.

Scoring. A straggler named in a run is a true positive when it is the
injected rank with the kind of the fault (``input`` -> input, ``compute`` ->
compute; ``comm`` -> any kind: tlog has no communication kind); every other
name is a false positive (healthy runs included). Per fault class and size:
precision TP / (TP + FP), recall TP / faulty runs, F1. The gain's error, over
true positives: tlog's ``speedup_if_fixed`` over the true speedup of
removing the fault (the run re-simulated without it; for the real jobs the
timers' lockstep figure), less 1.

Budget (the issue's bar, above the closed systems' published figures):
for each class, precision and recall at least 0.95 over faults of 20% or
more, the false positives of the healthy runs counted against every
class's precision. Exit status 1 if a class misses it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks import _accuracy_sim as sim
from benchmarks import _noise_profiles

SIZES = (0.05, 0.10, 0.20, 0.50, 1.00, 2.00)
WORLDS = (2, 4, 16, 64)
#: Steps per simulated run. Source: tlog's choice (a few warm-up steps, and
#: the 20 steady steps the straggler check needs on either side of an onset).
STEPS = 80
#: Budget: precision and recall per class over faults of at least BUDGET_FROM.
BUDGET = 0.95
BUDGET_FROM = 0.20
#: The kind of straggler each fault class calls for (None: any kind).
EXPECTED_KIND = {"input": "input", "compute": "compute", "comm": None}


@dataclass
class Outcome:
    """One judged run: what was injected, what tlog named, the gains."""

    suite: str
    profile: str
    world: int
    fault: str | None
    size: float | None
    rank: int | None
    onset: int | None
    measured: bool
    named: list[tuple[int, str]] = field(default_factory=list)
    gain_tlog: float | None = None
    gain_true: float | None = None
    seconds: float = 0.0
    #: the diagnosis's bottleneck category ("sync": the verdict names the collective wait)
    bottleneck: str | None = None

    @property
    def tp(self) -> int:
        """1 when the injected rank is named with the kind its fault calls for."""
        if self.fault is None:
            return 0
        want = EXPECTED_KIND.get(self.fault)
        return int(any(r == self.rank and (want is None or k == want) for r, k in self.named))

    @property
    def fp(self) -> int:
        """Names that are not the injected fault."""
        return len(self.named) - self.tp

    @property
    def speedup_error(self) -> float | None:
        """tlog's speedup over the true one, less 1 (true positives only)."""
        if not self.tp or self.gain_tlog is None or self.gain_true is None:
            return None
        return (1 + self.gain_tlog) / (1 + self.gain_true) - 1


def judge(db, run_dir: Path, run_id: str, out: Outcome) -> Outcome:
    """Ingest ``run_dir`` into ``db`` and diagnose it; fill ``out`` from the
    diagnosis's stragglers (the injected rank's ``gain_if_fixed`` kept)."""
    t0 = time.perf_counter()
    db.ingest(run_dir, run_id)
    d = db.diagnose(run_id)
    out.seconds = time.perf_counter() - t0
    out.named = [(s.rank, s.kind) for s in d.stragglers]
    out.bottleneck = d.bottleneck.category if d.bottleneck is not None else None
    hit = [s for s in d.stragglers if s.rank == out.rank]
    out.gain_tlog = hit[0].gain_if_fixed if hit else None
    return out


def simulated(db, tmp: Path, *, profiles: dict, worlds: tuple[int, ...],
              sizes: tuple[float, ...], seeds: int, healthy: int,
              steps: int = STEPS, progress: bool = True) -> list[Outcome]:
    """Suite 1 (module docstring): every profile x world x (class x size x
    seed, plus ``healthy`` runs); seeds and modes fixed by the loop order."""
    cases = []
    for name in profiles:
        for world in worlds:
            cases += [(name, world, None, 0.0) for _ in range(healthy)]
            cases += [(name, world, f, s) for f in sim.FAULT_CLASSES for s in sizes
                      for _ in range(seeds)]
    results = []
    t0 = time.perf_counter()
    for k, (name, world, fault, size) in enumerate(cases):
        run = sim.simulate(profiles[name], world, steps=steps, fault=fault, size=size,
                           seed=10_000 + k)
        measured = k % 2 == 1
        run_id = f"sim-{k}"
        sim.write_run(run, tmp / run_id, run_id=run_id, measured=measured,
                      tags={"bench": "accuracy", "profile": name})
        inj = run.injection
        out = Outcome(suite="sim", profile=name, world=world, fault=fault,
                      size=inj.size, rank=inj.rank, onset=inj.onset, measured=measured,
                      gain_true=sim.true_gain(run))
        results.append(judge(db, tmp / run_id, run_id, out))
        if progress and (k + 1) % 50 == 0:
            print(f"  {k + 1}/{len(cases)} runs, {time.perf_counter() - t0:.0f} s",
                  flush=True)
    return results


def real_ddp(db, tmp: Path) -> list[Outcome]:
    """Suite 2: the DDP scenarios' real gloo jobs (one torchrun, phases mode),
    scored against their bare timers. Empty (said) where gloo cannot run."""
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tests" / "ddp"))
    try:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_gloo_available()):
            print("  real DDP jobs left out: torch.distributed with gloo is not available")
            return []
        import ddp_runs
    finally:
        sys.path.pop(0)
    jobs = {"healthy": ("phases",), "input_straggler": ("phases",),
            "compute_straggler": ("phases",)}
    runs = ddp_runs.run_suite(jobs, tmp / "ddp")
    fault_of = {"healthy": None, "input_straggler": "input", "compute_straggler": "compute"}
    out = []
    for scenario, by_mode in runs.items():
        r = by_mode["phases"]
        truth = ddp_runs.Truth.load(r.truth_dir)
        fault = fault_of[scenario]
        slow = ddp_runs.SLOW_RANK if fault else None
        size = None
        gain = None
        if fault:
            per = truth.ranks[slow]
            size = per["steady_totals_s"]["fault_s"] / (
                per["steady_totals_s"]["step_s"] - per["steady_totals_s"]["fault_s"])
            gain = truth.lockstep_gain(slow) - 1
        o = Outcome(suite="ddp", profile="gloo-ddp", world=truth.world_size, fault=fault,
                    size=size, rank=slow, onset=0 if fault else None, measured=False,
                    gain_true=gain)
        out.append(judge(db, r.run_dir, f"ddp-{scenario}", o))
    return out


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def scores(rows: list[Outcome], healthy_fp: int = 0) -> dict:
    """TP, FP, FN, precision, recall, F1 over ``rows`` (faulty runs), the
    healthy runs' false positives ``healthy_fp`` added to FP; precision 1.0
    when nothing was named."""
    tp = sum(r.tp for r in rows)
    fp = sum(r.fp for r in rows) + healthy_fp
    pos = sum(1 for r in rows if r.fault is not None)
    p = tp / (tp + fp) if tp + fp else 1.0
    rec = tp / pos if pos else 1.0
    f1 = 2 * p * rec / (p + rec) if p + rec else 0.0
    return {"tp": tp, "fp": fp, "fn": pos - tp, "precision": p, "recall": rec, "f1": f1}


def print_table(results: list[Outcome], sizes: tuple[float, ...]) -> bool:
    """Print the per-class, per-size table, the healthy runs and the budget
    lines; True when every class meets the budget."""
    healthy = [r for r in results if r.fault is None]
    hfp = sum(r.fp for r in healthy)
    print(f"healthy runs: {len(healthy)}, false positives {hfp} "
          f"({sum(1 for r in healthy if r.fp)} runs with any)")
    print(f"{'class':<8} {'size':>5} {'runs':>5} {'TP':>4} {'FP':>4} {'FN':>4} "
          f"{'prec':>5} {'recall':>6} {'F1':>5} {'true gain':>9} {'speedup err med':>15} "
          f"{'max':>6}")
    ok = True
    for fault in sim.FAULT_CLASSES:
        for size in sizes:
            rows = [r for r in results if r.fault == fault and r.size == size]
            if not rows:
                continue
            s = scores(rows)
            errs = [r.speedup_error for r in rows if r.speedup_error is not None]
            gains = [r.gain_true for r in rows if r.gain_true is not None]
            print(f"{fault:<8} {size:>5.0%} {len(rows):>5} {s['tp']:>4} {s['fp']:>4} "
                  f"{s['fn']:>4} {s['precision']:>5.2f} {s['recall']:>6.2f} {s['f1']:>5.2f} "
                  f"{_f(statistics.median(gains) if gains else None, '{:+.1%}'):>9} "
                  f"{_f(statistics.median(errs) if errs else None, '{:+.1%}'):>15} "
                  f"{_f(max(errs, key=abs) if errs else None, '{:+.0%}'):>6}")
        big = [r for r in results if r.fault == fault and (r.size or 0) >= BUDGET_FROM - 1e-9]
        if not big:
            continue
        if fault == "comm":
            sync = sum(1 for r in big if r.bottleneck == "sync")
            calm = sum(1 for r in healthy if r.bottleneck == "sync")
            print(f"comm     >={BUDGET_FROM:.0%}: the verdict's bottleneck is the collective "
                  f"wait (sync) in {sync}/{len(big)} runs (healthy runs: {calm}/{len(healthy)})")
        s = scores(big, hfp)
        met = s["precision"] >= BUDGET and s["recall"] >= BUDGET
        ok &= met
        print(f"{fault:<8} >={BUDGET_FROM:.0%}: precision {s['precision']:.2f}, recall "
              f"{s['recall']:.2f}, F1 {s['f1']:.2f} (healthy false positives counted; "
              f"budget {BUDGET:.2f} both) {'ok' if met else 'MISS'}")
    return ok


def print_by_world(results: list[Outcome], worlds: tuple[int, ...]) -> None:
    """Recall per class and world size over faults of BUDGET_FROM or more,
    and false positives per world size."""
    print(f"{'recall >=' + format(BUDGET_FROM, '.0%'):<13}" + "".join(f"{w:>7}" for w in worlds))
    for fault in sim.FAULT_CLASSES:
        cells = []
        for w in worlds:
            rows = [r for r in results if r.fault == fault and r.world == w
                    and (r.size or 0) >= BUDGET_FROM - 1e-9]
            cells.append(f"{scores(rows)['recall']:>7.2f}" if rows else f"{'-':>7}")
        print(f"{fault:<13}" + "".join(cells))
    fps = [sum(r.fp for r in results if r.world == w) for w in worlds]
    print(f"{'false pos.':<13}" + "".join(f"{x:>7}" for x in fps))


def main(argv: list[str] | None = None) -> int:
    """Run the suites, print the tables; 1 if a class misses the budget."""
    import tlog

    ap = argparse.ArgumentParser(prog="bench_accuracy")
    ap.add_argument("--worlds", type=int, nargs="+", default=list(WORLDS))
    ap.add_argument("--sizes", type=float, nargs="+", default=list(SIZES))
    ap.add_argument("--seeds", type=int, default=1, help="runs per profile, world, class, size")
    ap.add_argument("--healthy", type=int, default=2, help="healthy runs per profile and world")
    ap.add_argument("--profiles", nargs="+", default=None,
                    help="noise profiles (default: all in benchmarks/data/noise_profiles.json)")
    ap.add_argument("--no-ddp", action="store_true", help="leave out the real gloo DDP jobs")
    ap.add_argument("--no-live", action="store_true", help="leave out the live time-to-detect")
    ap.add_argument("--live-runs", type=int, default=3)
    ap.add_argument("--dump", type=Path, default=None,
                    help="write every judged run here (JSON lines) for a closer look")
    args = ap.parse_args(argv)
    profiles = _noise_profiles.load()
    if args.profiles:
        profiles = {k: profiles[k] for k in args.profiles}
    sizes, worlds = tuple(args.sizes), tuple(args.worlds)
    ok = True
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        db = tlog.open(tmp / "accuracy.duckdb")
        for name, p in profiles.items():
            print(f"profile {name}: step {p.step_s * 1e3:.0f} ms; {p.source}")
        t0 = time.perf_counter()
        results = simulated(db, tmp, profiles=profiles, worlds=worlds, sizes=sizes,
                            seeds=args.seeds, healthy=args.healthy)
        print(f"simulated lockstep runs: {len(results)} in {time.perf_counter() - t0:.0f} s "
              f"(ingest + diagnose {np.median([r.seconds for r in results]):.2f} s median)")
        if args.dump is not None:
            args.dump.write_text("".join(json.dumps(vars(r)) + "\n" for r in results))
        ok &= print_table(results, sizes)
        print_by_world(results, worlds)
        # input and compute only: no communication fault is ever localised
        located = ("input", "compute")
        for label, keep in ([(f"profile {n}", lambda r, n=n: r.profile == n) for n in profiles]
                            + [(f"waits {'measured' if m else 'inferred'}",
                                lambda r, m=m: r.measured == m) for m in (False, True)]):
            sub = [r for r in results if keep(r)]
            big = [r for r in sub if r.fault in located and r.size >= BUDGET_FROM - 1e-9]
            s = scores(big, sum(r.fp for r in sub if r.fault is None))
            print(f"  {label}: input and compute >={BUDGET_FROM:.0%}: precision "
                  f"{s['precision']:.2f} recall {s['recall']:.2f}")
        if not args.no_ddp:
            print("real gloo DDP jobs (tests/ddp, 2 ranks, phases mode):")
            for o in real_ddp(db, tmp):
                print(f"  {o.fault or 'healthy':<8} size {_f(o.size, '{:.0%}')}: named "
                      f"{o.named or 'nobody'}; {'ok' if (o.tp if o.fault else not o.fp) else 'MISS'}"
                      f"; speedup tlog {_f(None if o.gain_tlog is None else 1 + o.gain_tlog, '{:.2f}x')}"
                      f", timers {_f(None if o.gain_true is None else 1 + o.gain_true, '{:.2f}x')}")
        if not args.no_live:
            from benchmarks import live_job

            print(f"time to detect, live ({args.live_runs} runs beside tlog serve):")
            ttd = live_job.time_to_detect(tmp / "live", runs=args.live_runs)
            print(live_job.summary_line(ttd))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
