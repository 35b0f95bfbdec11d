"""Time a ``tlog watch`` refresh (:func:`tlog.analyze.live.live_view`) as a run grows.

Run alone: ``python -m benchmarks.bench_watch`` (``--iterations N ...``);
``make bench`` runs it with the others.

The runs are ``bench_diagnose``'s 8-worker DFlash-style pipeline (about 60 ms
an iteration) at 100k and 1M iteration records, stored in time order as a run
ingested while it grows is (each follow round appends every worker's new
lines; ``bench_diagnose`` writes worker after worker, the worst case for the
window's ``ts`` filter, which DuckDB's zone maps then cannot skip: the
windowed load took 200 ms instead of 38 ms at 1M). Each is timed, best of
``--repeat`` (5), side by side: the live view (a diagnose of the last 30 s of the
run, :data:`tlog.analyze.live.DEFAULT_WINDOW_S`) and a diagnose of the whole
run (what the view would cost if it diagnosed everything every refresh).

Budget ("the diagnosis of a growing run must stay cheap per
refresh"; the ratio is tlog's choice): the refresh at the largest size costs
at most 3x the refresh at the smallest (its cost follows the window, not the
run). Exit status 1 if it misses.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import bench_diagnose

#: Budget: refresh time at the largest size over that at the smallest.
BUDGET_RATIO = 3.0


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(path: Path, iterations: int, repeat: int) -> tuple[float, float, int]:
    """``(live view s, whole diagnose s, iterations in the window)`` for a run of
    ``iterations`` records built at ``path``."""
    from tlog.analyze.live import live_view
    from tlog.analyze.verdict import diagnose
    from tlog.ingest.db import connect

    run_id = bench_diagnose.build(path, iterations)
    con = connect(path)
    try:   # time order, as the rounds of a follow loop store a growing run
        con.execute("CREATE TEMP TABLE by_time AS SELECT * FROM iterations ORDER BY ts; "
                    "DELETE FROM iterations; INSERT INTO iterations SELECT * FROM by_time; "
                    "CHECKPOINT")
    finally:
        con.close()
    con = connect(path, read_only=True)
    try:
        window = live_view(con, run_id).window.iterations
        live = _best(lambda: live_view(con, run_id), repeat)
        whole = _best(lambda: diagnose(con, run_id), repeat)
    finally:
        con.close()
    return live, whole, window


def main(argv: list[str] | None = None) -> int:
    """Measure, print, and return 1 if the budget is missed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.iterations:
            live, whole, window = measure(Path(tmp) / f"w{n}.duckdb", n, args.repeat)
            results.append((n, live, whole))
            print(f"  {n:>10,} iterations: refresh {live * 1000:7.0f} ms ({window:,} in the "
                  f"window), whole-run diagnose {whole * 1000:7.0f} ms, "
                  f"ratio {live / whole:.2f}", flush=True)
    ratio = results[-1][1] / results[0][1]
    ok = ratio <= BUDGET_RATIO
    print(f"  refresh at {results[-1][0]:,} / at {results[0][0]:,}: {ratio:.2f}x "
          f"(budget <= {BUDGET_RATIO:g}x): {'ok' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
