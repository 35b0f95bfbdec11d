"""Helpers of the ingest tests: table snapshots and hand-made records."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.runs import iter_line, write_lines  # noqa: F401  (re-exported)

DATA = Path(__file__).resolve().parent.parent / "data"
#: The repository root (where ``python -m tlog`` runs).
ROOT = Path(__file__).resolve().parent.parent.parent

#: Columns compared per table, and the order rows are listed in.
SNAPSHOT = {
    "runs": ("run_id, name, source, started, world_size, tags, config, phase_kinds",
             "run_id"),
    "iterations": (("rank, stage, worker, iter, ts, dur, cpu, tokens, samples, mem_allocated, "
                   "mem_reserved, mem_alloc_retries, mem_device_allocs, file, line, extra"),
                   "file, line"),
    "phases": ("rank, stage, worker, iter, seq, phase, parent, host_s, gpu_s, category",
               "rank, stage, worker, iter, seq"),
    "iteration_categories": (("rank, stage, worker, iter, starvation_s, backpressure_s, "
                             "compute_s, sync_s, unaccounted_s"),
                             "rank, stage, worker, iter"),
    "queue_samples": ("rank, stage, worker, name, ts, depth, capacity, file, line, extra",
                      "file, line"),
    "events": ("rank, stage, worker, name, ts, dur, file, line, extra", "file, line"),
    "workers": ("rank, stage, worker, host, pid, world_size, clock_wall, clock_mono, file",
                "rank, stage, worker"),
    "rejects": ("file, line, code, reason, raw", "file, line"),
    "files": ('path, "offset", lines, meta', "path"),
    "sys_samples": (("worker, ts, iter, cpu_s, rss_bytes, ncpu, load1, threads, running, cpu_wait_s, "
                     "cuda_allocated, cuda_reserved, cuda_retries, cuda_limit, gpu_util, "
                     "gpu_mem_used, gpu_mem_total, gpu_temp_c, gpu_sm_clock_mhz, "
                     "gpu_sm_clock_max_mhz, gpu_power_w, gpu_throttle, file, line, extra"),
                    "file, line"),
    "machines": (("worker, host, cpu_model, ncpu, mem_total, gpu_name, gpu_count, driver, "
                  "cuda, file"), "worker"),
}


def rows(con, sql: str, params: Any = None) -> list[dict[str, Any]]:
    """Query -> list of dicts; JSON columns decoded."""
    cur = con.execute(sql, params) if params is not None else con.execute(sql)
    names = [d[0] for d in cur.description]
    out = []
    for row in cur.fetchall():
        rec = {}
        for name, value in zip(names, row, strict=True):
            if name in ("tags", "config", "phase_kinds", "extra", "meta") and isinstance(value, str):
                value = json.loads(value)
            rec[name] = value
        out.append(rec)
    return out


def snapshot(con, run_id: str, tables: tuple[str, ...] = tuple(SNAPSHOT)) -> dict[str, list]:
    """The compared content of ``tables`` for one run."""
    out = {}
    for table in tables:
        cols, order = SNAPSHOT[table]
        out[table] = rows(con, f"SELECT {cols} FROM {table} WHERE run_id = ? ORDER BY {order}",
                          [run_id])
    return out


@contextmanager
def following(run: Path, db: Path) -> Iterator[tuple[list[str], list[str]]]:
    """``tlog ingest RUN --follow --interval 0.2`` in a subprocess: yields the
    stdout lines read so far (growing) and a list that, after the block, holds
    the return code and stderr (the process is stopped with SIGINT)."""
    proc = subprocess.Popen([sys.executable, "-m", "tlog", "ingest", str(run), "--db", str(db),
                             "--follow", "--interval", "0.2"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    ended: list = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        yield out, ended
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        reader.join(timeout=10)
        ended.extend([proc.returncode, err])
