"""The fixed cost of ingesting a run: many small runs, in one call and one by one.

Run alone: ``python -m benchmarks.bench_many_runs`` (``--runs``,
``--many-runs``, ``--json``); ``make bench`` runs it with the others.

Method, the budgeted path: ``--many-runs`` small runs are ingested in one call,
``tlog.open(db).ingest_many(runs)`` (what ``tlog ingest runs/*`` does: one
connection, each run's diagnosis stored), timed as a whole (wall and CPU);
the time per run, times 2,000, is the projection (``--many-runs 2000`` measures
2,000 for real). Then, for comparison, ``--runs`` small runs (one log each: a ``meta`` line and 20 iterations
of 3 phases) are written, then ingested one by one into one database file, as
a script or ``tlog ingest`` in a loop does it: ``tlog.open(db).ingest(run)``
(open the file, ``ingest_run``, store the run's diagnosis, close), timed per
run. Then the same runs into a second file with the steps timed apart: open
(``tlog.ingest.connect``), ``ingest_run``, the diagnosis stored
(``tlog.analyze.persist.ensure_attribution``), close (DuckDB checkpoints the
file). Medians per run are printed, and the first and last tenth's medians
(a cost that grows with the database shows there), and the median CPU time
per run (all threads of the process; steadier than wall time on a shared
machine, not budgeted).

Budget: 2,000 small runs ingest in under 2 minutes in one call, i.e. under
:data:`PER_RUN_BUDGET_S` a run. Exit status 1 when it is missed. The
one-by-one figure (a script calling ``ingest`` per run, or ``tlog ingest`` in a
shell loop, which adds an interpreter's start) is printed beside it, projected
the same way from its median, not budgeted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

#: Budget: 2,000 small runs within 120 s.
RUNS_BUDGET = 2000
SECONDS_BUDGET = 120.0
PER_RUN_BUDGET_S = SECONDS_BUDGET / RUNS_BUDGET
#: Iterations per small run.
ITERS = 20
PHASES = {"data": 0.002, "forward": 0.005, "backward": 0.004}


def write_runs(root: Path, n: int) -> list[Path]:
    """``n`` small run directories under ``root`` (one log each), in order."""
    out = []
    for i in range(n):
        d = root / f"run{i:05d}"
        d.mkdir(parents=True)
        lines = [json.dumps({"type": "meta", "v": 1, "rank": 0, "stage": "main"})]
        lines += [json.dumps({"type": "iter", "v": 1, "iter": k,
                              "ts": 1764403200.0 + i * 100 + k * 0.02, "dur": 0.012,
                              "phases": PHASES}) for k in range(ITERS)]
        (d / "rank0.main.jsonl").write_text("\n".join(lines) + "\n")
        out.append(d)
    return out


def time_api(db: Path, runs: list[Path], cpu: list[float] | None = None) -> list[float]:
    """Seconds of ``tlog.open(db).ingest(run)`` for each run, in order; with
    ``cpu``, the process's CPU seconds of each are appended to it (all threads:
    steadier than wall time on a shared machine)."""
    import tlog

    database = tlog.open(db)
    out = []
    for run in runs:
        t, c = time.perf_counter(), time.process_time()
        database.ingest(run)
        out.append(time.perf_counter() - t)
        if cpu is not None:
            cpu.append(time.process_time() - c)
    return out


def time_many(db: Path, runs: list[Path]) -> tuple[float, float]:
    """Seconds (wall, process CPU) of ``tlog.open(db).ingest_many(runs)``."""
    import tlog

    t, c = time.perf_counter(), time.process_time()
    reports = tlog.open(db).ingest_many(runs)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    if len(reports) != len(runs):
        raise SystemExit(f"ingest_many loaded {len(reports)} of {len(runs)} runs")
    return wall, cpu


def time_steps(db: Path, runs: list[Path]) -> dict[str, list[float]]:
    """Seconds of each step of one run's ingest (open, ingest_run, store, close)."""
    from tlog.analyze.persist import ensure_attribution
    from tlog.ingest import connect, ingest_run

    steps: dict[str, list[float]] = {"open": [], "ingest_run": [], "store": [], "close": []}
    for run in runs:
        t0 = time.perf_counter()
        con = connect(db)
        t1 = time.perf_counter()
        report = ingest_run(con, run)
        t2 = time.perf_counter()
        ensure_attribution(con, [report.run_id])
        t3 = time.perf_counter()
        con.close()
        t4 = time.perf_counter()
        for k, v in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            steps[k].append(v)
    return steps


def _tenth(xs: list[float], last: bool) -> float:
    k = max(1, len(xs) // 10)
    return statistics.median(xs[-k:] if last else xs[:k])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 1 if the budget is missed."""
    ap = argparse.ArgumentParser(prog="bench_many_runs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60,
                    help="small runs ingested one by one (default 60)")
    ap.add_argument("--many-runs", type=int, default=300,
                    help="small runs ingested in one call (default 300)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tlog-bench-many-runs-"))
    try:
        runs = write_runs(tmp / "runs", max(args.runs, args.many_runs))
        time_api(tmp / "warm.duckdb", runs[:1])     # imports, outside the figures
        many_wall, many_cpu = time_many(tmp / "many.duckdb", runs[:args.many_runs])
        cpu: list[float] = []
        api = time_api(tmp / "api.duckdb", runs[:args.runs], cpu)
        steps = time_steps(tmp / "steps.duckdb", runs[:args.runs])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    many_per_run = many_wall / args.many_runs
    projected = many_per_run * RUNS_BUDGET
    ok = projected <= SECONDS_BUDGET
    per_run = statistics.median(api)
    figures = {
        "many_runs": args.many_runs, "iterations_per_run": ITERS,
        "many_seconds": many_wall, "many_cpu_seconds": many_cpu,
        "many_per_run_s": many_per_run, "many_cpu_per_run_s": many_cpu / args.many_runs,
        "projected_2000_runs_s": projected, "budget_s": SECONDS_BUDGET,
        "ratio": projected / SECONDS_BUDGET,
        "runs": args.runs,
        "per_run_s": per_run, "cpu_per_run_s": statistics.median(cpu),
        "first_tenth_s": _tenth(api, False),
        "last_tenth_s": _tenth(api, True),
        "one_by_one_projected_2000_runs_s": per_run * RUNS_BUDGET,
        "steps_median_s": {k: statistics.median(v) for k, v in steps.items()},
        "ok": ok,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"{args.many_runs} small runs ({ITERS} iterations each) ingested in one call "
              f"(tlog.open(db).ingest_many(runs))")
        print(f"  in all                    : {many_wall:7.2f} s (CPU {many_cpu:.2f} s): "
              f"{many_per_run * 1000:.1f} ms a run (CPU "
              f"{figures['many_cpu_per_run_s'] * 1000:.1f} ms)")
        print(f"  2,000 runs: projected {projected:.0f} s / {SECONDS_BUDGET:.0f} s = "
              f"{figures['ratio']:.2f}  " + ("ok" if ok else "MISSED"))
        print(f"{args.runs} small runs ingested one by one (tlog.open(db).ingest(run)), "
              f"not budgeted")
        print(f"  per run (median)          : {per_run * 1000:7.1f} ms  (first tenth "
              f"{figures['first_tenth_s'] * 1000:.1f} ms, last tenth "
              f"{figures['last_tenth_s'] * 1000:.1f} ms); CPU "
              f"{figures['cpu_per_run_s'] * 1000:.1f} ms")
        print("  its steps (median)        : " + ", ".join(
            f"{k} {v * 1000:.1f} ms" for k, v in figures["steps_median_s"].items()))
        print(f"  2,000 runs one by one: projected "
              f"{figures['one_by_one_projected_2000_runs_s']:.0f} s, "
              f"{per_run / many_per_run:.1f}x the time of one call")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
