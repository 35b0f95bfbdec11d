"""Build small runs directly in a fresh tlog database (no ingest involved).

Each iteration is given as keyword arguments; phases are an ordered list of
``(name, host_s)`` or ``(name, host_s, gpu_s)`` tuples (``host_s`` may be None
for a gpu-only key). Categories follow ingest's rules (record ``kinds``, then
the run's ``phase_kinds``, then the built-in name rules).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tlog.analyze.system import MACHINE_SCHEMA, SAMPLE_SCHEMA
from tlog.ingest.db import connect

from dflash_runtime.format import resolve_category
from tests.support.phase_rows import insert_phase_rows


class RunBuilder:
    """Collects rows of one run and writes them with :meth:`write`."""

    def __init__(self, run_id: str = "r", *, phase_kinds: dict[str, str] | None = None,
                 started: float | None = None, tags: dict[str, Any] | None = None) -> None:
        self.run_id = run_id
        self.phase_kinds = phase_kinds or {}
        self.started = started     # the runs row's start (epoch s) and tags (run.json's)
        self.tags = tags
        self.iterations: list[tuple] = []
        self.phases: list[tuple] = []
        self.queues: list[tuple] = []
        self.events: list[tuple] = []
        self.hosts: dict[tuple[int, str, str], str] = {}
        self.sys: list[dict[str, Any]] = []
        self.machines: list[dict[str, Any]] = []

    def iteration(self, *, iter: int, ts: float, dur: float, phases: list[tuple],
                  rank: int = 0, stage: str = "main", worker: str | None = None,
                  cpu: float | None = None, tokens: int | None = None,
                  samples: int | None = None, kinds: dict[str, str] | None = None,
                  mem: dict[str, int] | None = None, host: str | None = None) -> None:
        worker = worker or f"{stage}-{rank}"
        if host is not None:
            self.hosts[(rank, stage, worker)] = host
        mem = mem or {}
        self.iterations.append((self.run_id, rank, stage, worker, iter, ts, dur, cpu, tokens,
                                samples, mem.get("allocated"), mem.get("reserved"),
                                mem.get("alloc_retries"), mem.get("device_allocs")))
        for seq, ph in enumerate(phases):
            name, host = ph[0], ph[1]
            gpu = ph[2] if len(ph) > 2 else None
            parent = name.rsplit("/", 1)[0] if "/" in name else None
            cat = resolve_category(name, kinds, self.phase_kinds)
            self.phases.append((self.run_id, rank, stage, worker, iter, seq, name, parent,
                                host, gpu, cat))

    def queue(self, *, name: str, ts: float, depth: int, capacity: int | None = None,
              rank: int | None = None, stage: str | None = None) -> None:
        self.queues.append((self.run_id, rank, stage, None, name, ts, depth, capacity))

    def event(self, *, name: str, ts: float, dur: float = 0.0, rank: int | None = None) -> None:
        self.events.append((self.run_id, rank, None, None, name, ts, dur))

    def sys_sample(self, *, ts: float, worker: str = "main-0", **fields: Any) -> None:
        """One ``sys_samples`` row (columns of ``tlog.analyze.system.SAMPLE_SCHEMA``;
        the ones not given are null)."""
        self.sys.append({"worker": worker, "ts": ts, **fields})

    def machine(self, *, worker: str = "main-0", **fields: Any) -> None:
        """One ``machines`` row (``tlog.analyze.system.MACHINE_SCHEMA``)."""
        self.machines.append({"worker": worker, **fields})

    def write(self, path: Path):
        """Write the run into the database at ``path`` and return an open connection."""
        con = connect(path)
        con.execute("INSERT INTO runs (run_id, phase_kinds, started, tags) VALUES (?, ?, ?, ?)",
                    [self.run_id, json.dumps(self.phase_kinds), self.started,
                     None if self.tags is None else json.dumps(self.tags)])
        if self.iterations:
            _insert_iterations(con, self.iterations)
        if self.phases:
            insert_phase_rows(con, self.phases)
        if self.hosts:
            con.executemany("INSERT INTO workers (run_id, rank, stage, worker, host) "
                            "VALUES (?, ?, ?, ?, ?)",
                            [(self.run_id, *key, host) for key, host in self.hosts.items()])
        if self.queues:
            con.executemany("INSERT INTO queue_samples (run_id, rank, stage, worker, name, ts, "
                            "depth, capacity) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", self.queues)
        if self.events:
            con.executemany("INSERT INTO events (run_id, rank, stage, worker, name, ts, dur) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?)", self.events)
        for table, rows, schema in (("sys_samples", self.sys, SAMPLE_SCHEMA),
                                    ("machines", self.machines, MACHINE_SCHEMA)):
            if rows:
                cols = list(schema)
                con.executemany(
                    f"INSERT INTO {table} (run_id, {', '.join(cols)}) "
                    f"VALUES (?, {', '.join('?' for _ in cols)})",
                    [(self.run_id, *(r.get(c) for c in cols)) for r in rows])
        return con


def _insert_iterations(con, rows: list[tuple]) -> None:
    """``iterations`` rows through an Arrow table: ``executemany`` took 30 s for
    the 10,000 rows of a 256-rank run."""
    import pyarrow as pa

    names = ("run_id", "rank", "stage", "worker", "iter", "ts", "dur", "cpu", "tokens",
             "samples", "mem_allocated", "mem_reserved", "mem_alloc_retries",
             "mem_device_allocs")
    types = (pa.string(), pa.int32(), pa.string(), pa.string(), pa.int64(), pa.float64(),
             pa.float64(), pa.float64(), pa.int64(), pa.int64(), pa.int64(), pa.int64(),
             pa.int64(), pa.int64())
    cols = list(zip(*rows, strict=True))
    table = pa.table({n: pa.array(c, type=t) for n, c, t in zip(names, cols, types, strict=True)})
    con.register("_tlog_iter_rows", table)
    try:
        con.execute(f"INSERT INTO iterations ({', '.join(names)}) "
                    f"SELECT {', '.join(names)} FROM _tlog_iter_rows")
    finally:
        con.unregister("_tlog_iter_rows")


def loop(builder: RunBuilder, n: int, phases: Any, *, dur: float | None = None,
         t0: float = 1000.0, **kw: Any) -> float:
    """Add ``n`` iterations of one worker; ``phases`` is a list or a function of
    the iteration number returning one. ``dur`` defaults to the sum of host
    times. Returns the end time."""
    ts = t0
    for i in range(n):
        ph = phases(i) if callable(phases) else phases
        d = dur if dur is not None else sum(p[1] or 0.0 for p in ph if "/" not in p[0])
        d = d(i) if callable(d) else d
        builder.iteration(iter=i, ts=ts, dur=d, phases=ph, **kw)
        ts += d
    return ts
