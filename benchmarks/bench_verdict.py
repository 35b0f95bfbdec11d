"""Time to a verdict, as a user types the commands: ``tlog ingest`` (the
diagnosis stored), then ``tlog diagnose`` and ``tlog runs`` of the stored run,
each side by side with the DuckDB or Python floor it is held to.

Run alone: ``python -m benchmarks.bench_verdict`` (``--ranks``, ``--iters``,
``--repeat``, ``--json``); ``make bench`` runs it with the others.

Method: the bench run of :mod:`benchmarks.bench_ingest` (4 ranks x 75,000
iteration records of 6 phases: 300,004 lines) is written once. Each command
runs in a fresh interpreter (``python -m tlog``), ``--repeat`` rounds, the
variants interleaved in every round so that all see the same machine load; the
minimum wall time of each is kept (the least-disturbed run; the machine is
shared). A warm-up round first. The children may write compiled modules
(``PYTHONDONTWRITEBYTECODE`` is dropped from their environment): an installed
tlog has them, and compiling tlog's modules at every start would be timed
otherwise.

Budgets (issue "fast to a verdict", docs/DATABASE.md):

- ``tlog ingest RUN --db NEW`` (load, diagnose, store the diagnosis), its
  start-up left out (the wall time of ``tlog --help`` subtracted), against
  DuckDB's ``CREATE TABLE AS SELECT * FROM read_json(...)`` of the same files
  into a new database file (in this process, as ``bench_ingest`` times it):
  ``read_json / ingest`` at least :data:`INGEST_RATIO`.
- ``tlog diagnose --run RUN`` and ``tlog runs`` of the stored run within
  :data:`READ_RATIO` times ``python -c "import duckdb, polars"`` (the floor of
  any command that reads the database into frames).

Exit status 1 when a budget is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_ingest import _fresh, generate, time_raw

#: Budget: DuckDB read_json time / tlog ingest time (start-up left out).
INGEST_RATIO = 0.35
#: Budget: tlog diagnose / tlog runs of a stored run, over ``import duckdb, polars``.
READ_RATIO = 2.0
ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)    # an installed tlog has compiled modules
    env.pop("TLOG_DB", None)
    return env


def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   cwd=ROOT, env=_env())
    return time.perf_counter() - t


def measure(run: Path, tmp: Path, repeat: int, *, warm_up: bool = True) -> dict:
    """Minimum wall seconds of each command over ``repeat`` interleaved rounds
    (after a warm-up round unless ``warm_up`` is False), and the ratios of the
    budgets. The database of the last round is left at ``tmp/verdict.duckdb``."""
    tlog = [sys.executable, "-m", "tlog"]
    db = tmp / "verdict.duckdb"
    cmds = {
        "help": [*tlog, "--help"],
        "ingest": [*tlog, "ingest", str(run), "--db", str(db)],
        "diagnose": [*tlog, "diagnose", "--run", run.name, "--db", str(db)],
        "runs": [*tlog, "runs", "--db", str(db)],
        "import": [sys.executable, "-c", "import duckdb, polars"],
    }
    best = {k: float("inf") for k in (*cmds, "read_json")}
    for r in range(0 if warm_up else 1, repeat + 1):
        got = {"read_json": time_raw(run, tmp / "raw.duckdb")}
        for name, cmd in cmds.items():
            if name == "ingest":
                _fresh(db)
            got[name] = _wall(cmd)
        if r:                           # round 0 warms up (compiled modules, page cache)
            best = {k: min(best[k], v) for k, v in got.items()}
    ingest = best["ingest"] - best["help"]
    return {
        "seconds": best, "ingest_without_startup_s": ingest,
        "ingest_ratio": best["read_json"] / ingest,
        "diagnose_ratio": best["diagnose"] / best["import"],
        "runs_ratio": best["runs"] / best["import"],
        "repeat": repeat,
    }


def ok(r: dict) -> dict[str, bool]:
    """Each budget met or not."""
    return {"ingest": r["ingest_ratio"] >= INGEST_RATIO,
            "diagnose": r["diagnose_ratio"] <= READ_RATIO,
            "runs": r["runs_ratio"] <= READ_RATIO}


def render(r: dict, lines: int) -> str:
    """The figures as text, side by side."""
    s, good = r["seconds"], ok(r)

    def mark(key: str) -> str:
        return "ok" if good[key] else "MISS"

    return "\n".join([
        (f"time to a verdict on the bench run ({lines:,} lines; min of {r['repeat']} "
         f"interleaved rounds, each command a fresh interpreter):"),
        (f"  tlog ingest (diagnosis stored) {s['ingest']:7.3f} s - tlog --help "
         f"{s['help']:.3f} s = {r['ingest_without_startup_s']:.3f} s; DuckDB read_json "
         f"{s['read_json']:.3f} s: {r['ingest_ratio']:.2f}x (budget >= {INGEST_RATIO}x)  "
         f"{mark('ingest')}"),
        (f"  tlog diagnose of the stored run {s['diagnose']:7.3f} s vs python -c 'import "
         f"duckdb, polars' {s['import']:.3f} s: {r['diagnose_ratio']:.2f}x (budget <= "
         f"{READ_RATIO:g}x)  {mark('diagnose')}"),
        (f"  tlog runs                       {s['runs']:7.3f} s vs the same: "
         f"{r['runs_ratio']:.2f}x (budget <= {READ_RATIO:g}x)  {mark('runs')}"),
    ])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 1 if a budget is missed."""
    ap = argparse.ArgumentParser(prog="bench_verdict", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--iters", type=int, default=75_000, help="iter records per rank")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tlog-bench-verdict-"))
    try:
        run = tmp / "run"
        generate(run, ranks=args.ranks, iters=args.iters)
        r = measure(run, tmp, args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    r["ok"] = ok(r)
    lines = args.ranks * (args.iters + 1)
    print(json.dumps(r, indent=2) if args.json else render(r, lines))
    return 0 if all(r["ok"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
