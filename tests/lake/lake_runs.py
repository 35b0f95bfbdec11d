"""Runs for the lake tests: the one-truth runs (tests/history/truth_runs.py) on "two
hosts" (two databases), and four synthetic DDP jobs of four ranks on four hosts, one
host slow in three of them (a chronic straggler) and another in one (a one-off).

Nothing of tlog makes the truth here: the jobs are simulated by
tests/diagnosis/lockstep_sim.py with a forward pass 60% longer on the slow host.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "history"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diagnosis"))

from lockstep_sim import simulate
from tlog.ingest.db import connect
from truth_runs import ddp_run, pipeline_run, restart_run, write_runs

#: Per job: the hosts of ranks 0..3 and the slow host (its forward 60% longer).
#: h2 is slow in jobs 1, 2 and 4 (on ranks 2, 0 and 3); h0 once, in job 3.
JOBS = {
    "job1": (["h0", "h1", "h2", "h3"], "h2"),
    "job2": (["h2", "h3", "h0", "h1"], "h2"),
    "job3": (["h1", "h0", "h3", "h2"], "h0"),
    "job4": (["h3", "h1", "h0", "h2"], "h2"),
}
#: job -> (started epoch s, tags): one month apart from 2026-01-15, config 'a' or 'b'.
JOB_STARTS = {"job1": (1768435200.0, {"config": "a"}), "job2": (1771113600.0, {"config": "a"}),
              "job3": (1773532800.0, {"config": "b"}), "job4": (1776211200.0, {"config": "a"})}


def job_run(run_id: str, *, n: int = 40, seed: int = 0):
    """A synthetic DDP job (:data:`JOBS`): a RunBuilder."""
    hosts, slow = JOBS[run_id]
    means = [(0.010, 0.048 if h == slow else 0.030, 0.030, 0.005) for h in hosts]
    return simulate(means, n=n, hosts=hosts, run_id=run_id, seed=seed,
                    t0=JOB_STARTS[run_id][0]).builder


def write_jobs(db: Path, run_ids: list[str]) -> Path:
    """Write the jobs ``run_ids`` into ``db`` with their start and tags; closed."""
    for run_id in run_ids:
        con = job_run(run_id, seed=int(run_id[-1])).write(db)
        started, tags = JOB_STARTS[run_id]
        con.execute("UPDATE runs SET started = ?, tags = ? WHERE run_id = ?",
                    [started, json.dumps(tags), run_id])
        con.close()
    return db


def host_a(db: Path) -> Path:
    """The first "host": pipe and ddp, and jobs 1 and 2."""
    write_runs(db, [pipeline_run(), ddp_run()])
    return write_jobs(db, ["job1", "job2"])


def host_b(db: Path) -> Path:
    """The second "host": restart, and jobs 3 and 4."""
    write_runs(db, [restart_run()])
    return write_jobs(db, ["job3", "job4"])


def merge(target: Path, sources: list[Path]) -> Path:
    """A database at ``target`` holding every row of ``sources`` (tlog schema, one run each)."""
    with connect(target) as con:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' "
            "AND table_schema = 'main' AND table_name <> 'tlog_schema'").fetchall()]
        for k, src in enumerate(sources):
            con.execute(f"ATTACH '{src}' AS s{k} (READ_ONLY)")
            for t in tables:
                con.execute(f"INSERT INTO main.{t} SELECT * FROM s{k}.main.{t}")
            con.execute(f"DETACH s{k}")
    return target


def copy_lake(lake: Path, to: Path) -> Path:
    """A copy of a lake to change."""
    return Path(shutil.copytree(lake, to))
