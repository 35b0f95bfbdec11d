"""Precision and recall of the straggler finding in lockstep DDP runs of 8 to 256 ranks.

Run alone: ``python -m benchmarks.bench_stragglers`` (``--sizes 8 64 256
--levels 0.05 0.1 0.2 0.3 --seeds 2``); ``make bench`` runs it with the others.

Each run is simulated by the tests' lockstep model (``tests/diagnosis/lockstep_sim.py``:
every rank's own work per phase with 2% jitter, the gradient all-reduce at
the end of ``backward`` releasing all ranks at the slowest arrival), 30
steps. A straggler run makes one rank, drawn at random, slower in forward by
a share of the 75 ms of own work per step (5% to 30%); a healthy run has
noise only. A run counts as a true positive when exactly the slow rank is
named, a false positive for every other rank named (healthy runs included),
a false negative when the slow rank is not named. Printed per size and
level: the named share, the lockstep gain tlog gives and the true gain (the
construction re-simulated with the rank at its peers' pace).

Budget ("healthy runs name nobody; a 10% straggler is named at 256
ranks"; tlog's choice of bars): precision 1.0 over all runs, recall 1.0 for
stragglers of 10% or more. Exit status 1 if either misses.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_TESTS = Path(__file__).resolve().parents[1] / "tests" / "diagnosis"

#: (data_wait, forward, backward own part, optimizer) seconds: the tests' base rank.
BASE = (0.005, 0.020, 0.040, 0.010)
#: Budget: precision over all runs; recall over stragglers of at least RECALL_FROM.
BUDGET_PRECISION = 1.0
BUDGET_RECALL = 1.0
RECALL_FROM = 0.10


def _sim():
    if str(_TESTS) not in sys.path:
        sys.path.insert(0, str(_TESTS))
    import lockstep_sim

    return lockstep_sim


def judge(path: Path, ranks: int, level: float, seed: int, steps: int = 30) -> dict:
    """Simulate one run (``level`` 0: healthy) and diagnose it; returns the
    slow rank (None), the ranks named, tlog's gain for the slow rank and the
    true gain, and the diagnose time in seconds."""
    from tlog.analyze import diagnose

    sim_mod = _sim()
    rng = np.random.default_rng(seed)
    slow = int(rng.integers(ranks)) if level > 0 else None
    means = [BASE] * ranks
    if slow is not None:
        means[slow] = (BASE[0], BASE[1] + level * sum(BASE), BASE[2], BASE[3])
    sim = sim_mod.simulate(means, n=steps, seed=seed)
    con = sim.builder.write(path)
    try:
        t0 = time.perf_counter()
        d = diagnose(con, "r")
        secs = time.perf_counter() - t0
    finally:
        con.close()
    named = sorted(s.rank for s in d.stragglers if s.kind == "compute")
    gain = next((s.gain_if_fixed for s in d.stragglers if s.rank == slow), None)
    truth = (sim_mod.true_total(sim) / sim_mod.fixed_total(sim, slow) - 1
             if slow is not None else None)
    return {"ranks": ranks, "level": level, "slow": slow, "named": named, "gain": gain,
            "truth": truth, "seconds": secs}


def score(results: list[dict]) -> dict:
    """``tp``, ``fp``, ``fn``, ``precision``, ``recall`` (recall over runs with a
    straggler; precision 1.0 when nothing was named)."""
    tp = sum(1 for r in results if r["slow"] is not None and r["slow"] in r["named"])
    fp = sum(len([x for x in r["named"] if x != r["slow"]]) for r in results)
    pos = sum(1 for r in results if r["slow"] is not None)
    return {"tp": tp, "fp": fp, "fn": pos - tp,
            "precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / pos if pos else 1.0}


def main(argv: list[str] | None = None) -> int:
    """Run the grid, print per size and level, then the scores; 1 if over budget."""
    ap = argparse.ArgumentParser(prog="bench_stragglers")
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--levels", type=float, nargs="+", default=[0.05, 0.10, 0.20, 0.30])
    ap.add_argument("--seeds", type=int, default=2, help="runs per size and level")
    ap.add_argument("--healthy", type=int, default=3, help="healthy runs per size")
    args = ap.parse_args(argv)
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        k = 0
        for ranks in args.sizes:
            for level in [0.0] * args.healthy + [lv for lv in args.levels
                                                 for _ in range(args.seeds)]:
                k += 1
                results.append(judge(Path(tmp) / f"{k}.duckdb", ranks, level, seed=1000 + k))
    print(f"{'ranks':>5} {'straggler':>9} {'runs':>4} {'named':>6} {'gain tlog':>10} "
          f"{'gain true':>10} {'wrong':>5} {'diagnose':>9}")
    for ranks in args.sizes:
        for level in [0.0, *args.levels]:
            rows = [r for r in results if r["ranks"] == ranks and r["level"] == level]
            if not rows:
                continue
            hit = sum(1 for r in rows if r["slow"] is not None and r["slow"] in r["named"])
            wrong = sum(len([x for x in r["named"] if x != r["slow"]]) for r in rows)
            gains = [r["gain"] for r in rows if r["gain"] is not None]
            truths = [r["truth"] for r in rows if r["truth"] is not None]
            g = f"{np.mean(gains):+.1%}" if gains else "-"
            t = f"{np.mean(truths):+.1%}" if truths else "-"
            label = "healthy" if level == 0 else f"{level:.0%}"
            named = f"{hit}/{len(rows)}" if level else "-"
            secs = np.mean([r["seconds"] for r in rows])
            print(f"{ranks:>5} {label:>9} {len(rows):>4} {named:>6} {g:>10} {t:>10} "
                  f"{wrong:>5} {secs:>8.1f}s")
    every = score(results)
    big = score([r for r in results if r["level"] == 0 or r["level"] >= RECALL_FROM])
    print(f"precision {every['precision']:.2f} ({every['tp']} named right, {every['fp']} wrong); "
          f"recall {every['recall']:.2f} over all stragglers, {big['recall']:.2f} over "
          f"{RECALL_FROM:.0%} or more (budget: precision {BUDGET_PRECISION:.2f}, "
          f"recall {BUDGET_RECALL:.2f})")
    ok = every["precision"] >= BUDGET_PRECISION and big["recall"] >= BUDGET_RECALL
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
