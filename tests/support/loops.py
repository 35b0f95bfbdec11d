"""Pieces of the child-process loops whose own timers are the truth of a test
(tests/diagnosis/*_loop.py, tests/history/model_loop.py), and the parent's
run-ingest-diagnose step. Linux ``/proc`` readers; standard library only on
the child side (the parent side imports tlog).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_queue_s() -> float:
    """The calling thread's run-queue delay so far (seconds): the time it waited
    runnable for a core (``/proc/self/task/<tid>/schedstat`` field 2, ns)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def _spin() -> None:
    while True:
        pass


def crowd_one_core(spinners: int) -> list[Any]:
    """Pin this process to one core (``os.sched_setaffinity``) and start
    ``spinners`` busy processes (forked: each inherits the core); the caller
    ends them with :func:`stop_all`."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_spin, daemon=True) for _ in range(spinners)]
    for p in procs:
        p.start()
    return procs


def stop_all(procs: list[Any]) -> None:
    """End the processes :func:`crowd_one_core` started."""
    for p in procs:
        p.terminate()
        p.join()


def run_loop(script: Path, run: Path, *args: str, timeout: float = 180) -> Any:
    """Run a loop script as its own process (``script RUN_DIR ARGS...``, the
    repository importable, the shim at its default sampling pace) and return
    the JSON of its last output line (its own truth)."""
    env = {k: v for k, v in os.environ.items() if k != "TLOG_SYS_INTERVAL"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, str(script), str(run), *args], env=env,
                         capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def ingest_all(db: Path, *runs: Path) -> None:
    """Ingest each run directory into ``db``."""
    from tlog.ingest import ingest_run
    from tlog.ingest.db import connect

    con = connect(db)
    try:
        for run in runs:
            ingest_run(con, run)
    finally:
        con.close()


def diagnosed(db: Path, run_id: str) -> Any:
    """``tlog.analyze.diagnose`` of ``run_id`` in ``db`` (read-only)."""
    from tlog.analyze import diagnose
    from tlog.ingest.db import connect

    with connect(db, read_only=True) as con:
        return diagnose(con, run_id)
