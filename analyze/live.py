"""The live view of a growing run (``tlog watch``): where it stands now.

:func:`live_view` answers, for a run still being written: its throughput
*now* and against its high-water mark, the per-stage shares, the
bottleneck, the stragglers, the latest queue depths and the memory trend,
as a typed :class:`LiveView`. Every figure is ``tlog diagnose``'s
(:func:`tlog.analyze.verdict.diagnose`), computed over a **window**: the
iterations that started in the last ``window_s`` seconds of the run's own
clock (up to its latest iteration end), not the whole run.

Why a window: diagnose is not incremental (each call loads and attributes
the run again; 0.4-0.5 s at 1M iterations, ~12 s at 10M), so a refresh
every couple of seconds over the whole run would cost more and more as the
run grows. Over a window, a refresh costs the same at 100k or 10M
iterations (what it costs is in :attr:`LiveView.seconds`; docs/DIAGNOSIS.md
"The live view" has the measured figures), and "now" means now: a stall
ten minutes ago does not weigh on the shares shown. The catch, said in the
view: warm-up is looked for at the window's start as at a run's start, so
an unsettled window start counts as warm-up; the whole run's diagnosis is
``tlog diagnose``'s (stored by the follow loop, :meth:`tlog.api.Database.follow`).

Units: seconds and epoch seconds, bytes, shares in [0, 1].
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
from tlog.analyze.baseline import THROUGHPUT_UNITS, HighWaterMark
from tlog.ingest.errors import RunNotFoundError

if TYPE_CHECKING:
    from tlog.analyze.rules import Thresholds
    from tlog.analyze.verdict import Diagnosis

#: Seconds of the run's latest iterations a live view diagnoses (its "now").
#: Source: tlog's choice: long enough to hold several iterations of a slow
#: loop (a few seconds each) and a queue's swings, short enough that a change
#: shows within half a minute.
DEFAULT_WINDOW_S = 30.0

#: Workers whose memory trend a view keeps (those growing fastest first).
#: Source: tlog's choice (what fits a terminal).
MEMORY_WORKERS = 4


@dataclass(frozen=True)
class Window:
    """The part of the run a live view diagnoses.

    Attributes:
        since: epoch s; the iterations starting at or after it are in it.
        first: epoch s; the earliest start of an iteration in it (>= since).
        until: epoch s; the run's latest iteration end.
        iterations: iteration records in the window (every worker).
        whole_run: the window holds every iteration of the run.
    """

    since: float
    first: float
    until: float
    iterations: int
    whole_run: bool

    @property
    def seconds(self) -> float:
        """The run time its iterations span, ``until - first`` (s)."""
        return self.until - self.first


@dataclass(frozen=True)
class QueueDepth:
    """The latest depth sample of one logged queue (``queue_samples``).

    Attributes:
        name: the queue's name as logged.
        stage, rank, worker: the process that sampled it.
        ts: the sample's time (epoch s).
        depth: items in the queue then.
        capacity: its capacity (items), or None when not logged.
    """

    name: str
    stage: str
    rank: int
    worker: str
    ts: float
    depth: int
    capacity: int | None


@dataclass(frozen=True)
class MemoryTrend:
    """One worker's device memory (the iterations' ``mem.allocated``, bytes).

    Attributes:
        stage, rank, worker: the worker.
        first_bytes: its first sample of the run.
        latest_bytes: its latest sample.
        peak_bytes: its highest sample in the window.
        slope_bytes_per_s: the least-squares slope of its samples over the
            window (bytes per second; None with fewer than 2 samples there).
        samples: its samples in the window.
    """

    stage: str
    rank: int
    worker: str
    first_bytes: int
    latest_bytes: int
    peak_bytes: int
    slope_bytes_per_s: float | None
    samples: int


@dataclass(frozen=True)
class LiveView:
    """Where a growing run stands (module docstring).

    Attributes:
        run_id: the run.
        iterations: its iteration records so far (every worker, whole run).
        window: what :attr:`diagnosis` covers (:class:`Window`).
        diagnosis: ``tlog diagnose``'s verdict over the window: per-stage
            shares (``stages[i].categories``), ``bottleneck`` (stage,
            category, phase), ``stragglers``, ``findings``, ``queues``.
        unit: the throughput unit shown: the first of tokens/s, samples/s,
            it/s the window reports (the order runs are ranked in).
        now: the window's steady throughput in :attr:`unit` (None when the
            window has no steady iteration yet).
        high_water: the best earlier run of the same configuration
            (:func:`tlog.analyze.baseline.high_water_mark`), or None when not
            looked up.
        queues: the latest depth of each logged queue in the window.
        memory: the device memory trend of up to :data:`MEMORY_WORKERS`
            workers, fastest growing first (empty without ``mem`` figures:
            the shim records them only with CUDA).
        last_end: epoch s of the run's latest iteration end.
        as_of: epoch s when the view was computed.
        seconds: how long computing it took (s).
    """

    run_id: str
    iterations: int
    window: Window
    diagnosis: Diagnosis
    unit: str
    now: float | None
    high_water: HighWaterMark | None
    queues: tuple[QueueDepth, ...]
    memory: tuple[MemoryTrend, ...]
    last_end: float
    as_of: float
    seconds: float

    @property
    def idle_s(self) -> float:
        """Seconds from the run's latest iteration end to :attr:`as_of`
        (a stalled or finished run grows it; clocks of other hosts may skew it)."""
        return self.as_of - self.last_end

    @property
    def high_water_value(self) -> float | None:
        """The high-water mark's throughput in :attr:`unit`, or None."""
        if self.high_water is None or self.high_water.run_id is None:
            return None
        key = _key_of(self.unit)
        return self.high_water.value(key) if key else None

    @property
    def vs_high_water(self) -> float | None:
        """:attr:`now` over the high-water mark's throughput in the same unit
        (1.0: as fast), or None when either is missing."""
        hw = self.high_water_value
        if self.now is None or not hw:
            return None
        return self.now / hw


def _key_of(unit: str) -> str | None:
    return next((k for k, u in THROUGHPUT_UNITS if u == unit), None)


def run_extent(con: duckdb.DuckDBPyConnection, run_id: str
               ) -> tuple[int, float, float] | None:
    """``(iterations, latest start, latest end)`` of a run (count, epoch s,
    epoch s), or None when it has no iteration yet. One scan of the run's
    ``iter``-table rows (``ts``, ``dur``)."""
    row = con.execute("SELECT count(*), max(ts), max(ts + dur) FROM iterations "
                      "WHERE run_id = ?", [run_id]).fetchall()[0]
    if not row[0]:
        return None
    return int(row[0]), float(row[1]), float(row[2])


def live_view(con: duckdb.DuckDBPyConnection, run_id: str, *,
              window_s: float = DEFAULT_WINDOW_S, high_water: HighWaterMark | None = None,
              thresholds: Thresholds | None = None) -> LiveView:
    """The live view of ``run_id`` (module docstring).

    Args:
        con: an open tlog database (read-only is enough).
        run_id: the run, as ingested so far.
        window_s: seconds of the run's latest iterations to diagnose (> 0):
            those starting at or after its latest iteration end minus
            ``window_s`` (and at least the latest-starting one).
        high_water: the run's high-water mark, looked up once by the caller
            (:func:`tlog.analyze.baseline.high_water_mark`: it reads every
            run, and earlier runs do not change while one is watched).
        thresholds: the findings' limits (``Thresholds()`` when None).

    Raises:
        RunNotFoundError: no such run, or it holds no iterations yet.
        ValueError: ``window_s`` not a positive number.
    """
    from tlog.analyze.verdict import diagnose

    if not window_s > 0:
        msg = f"window_s must be a positive number of seconds, got {window_s!r}"
        raise ValueError(msg)
    t0 = time.perf_counter()
    extent = run_extent(con, run_id)
    if extent is None:
        msg = (f"run {run_id!r} holds no iterations yet: ingest its log files "
               f"('tlog ingest RUN_DIR')")
        raise RunNotFoundError(msg)
    total, last_start, last_end = extent
    since = min(last_end - window_s, last_start)
    d = diagnose(con, run_id, thresholds=thresholds, since=since)
    n = d.iterations.total
    window = Window(since=since, first=float(d.analysis.iterations["ts"].min()), until=last_end,
                    iterations=n, whole_run=n == total)
    tp = d.throughput
    unit, now = "it/s", tp.iters_per_s
    for key, name in THROUGHPUT_UNITS:
        if getattr(tp, key) is not None:
            unit, now = name, getattr(tp, key)
            break
    return LiveView(run_id=run_id, iterations=total, window=window, diagnosis=d, unit=unit,
                    now=now, high_water=high_water, queues=_latest_queues(d),
                    memory=_memory(con, run_id, d), last_end=last_end, as_of=time.time(),
                    seconds=time.perf_counter() - t0)


def _latest_queues(d: Diagnosis) -> tuple[QueueDepth, ...]:
    """The latest sample of each (queue, stage, rank, worker) in the window."""
    import polars as pl

    q = d.analysis.data.queues
    if q.height == 0:
        return ()
    keys = ["name", "stage", "rank", "worker"]
    last = q.sort("ts").group_by(keys, maintain_order=True).last().sort(keys)
    return tuple(QueueDepth(name=r["name"], stage=r["stage"], rank=int(r["rank"]),
                            worker=r["worker"], ts=float(r["ts"]), depth=int(r["depth"]),
                            capacity=None if r["capacity"] is None else int(r["capacity"]))
                 for r in last.with_columns(pl.col("stage", "worker").cast(pl.String))
                 .iter_rows(named=True))


def _memory(con: duckdb.DuckDBPyConnection, run_id: str, d: Diagnosis
            ) -> tuple[MemoryTrend, ...]:
    """Per worker with ``mem.allocated`` samples in the window: the trend
    (least-squares slope over the window), fastest growing first."""
    import numpy as np
    import polars as pl

    it = d.analysis.iterations
    if "mem_allocated" not in it.columns or it["mem_allocated"].null_count() == it.height:
        return ()
    mem = (it.select(pl.col("stage", "worker").cast(pl.String), "rank", "ts",
                     "mem_allocated").drop_nulls("mem_allocated"))
    firsts = {(r[0], r[1], r[2]): int(r[3]) for r in con.execute(
        "SELECT stage, rank, worker, arg_min(mem_allocated, ts) FROM iterations "
        "WHERE run_id = ? AND mem_allocated IS NOT NULL GROUP BY ALL", [run_id]).fetchall()}
    out = []
    for (stage, rank, worker), g in mem.group_by(["stage", "rank", "worker"]):
        g = g.sort("ts")
        ts, b = g["ts"].to_numpy(), g["mem_allocated"].to_numpy().astype(np.float64)
        slope = None
        if len(ts) >= 2 and np.ptp(ts) > 0:
            slope = float(np.polyfit(ts - ts[0], b, 1)[0])
        out.append(MemoryTrend(stage=stage, rank=int(rank), worker=worker,
                               first_bytes=firsts.get((stage, rank, worker), int(b[0])),
                               latest_bytes=int(b[-1]), peak_bytes=int(b.max()),
                               slope_bytes_per_s=slope, samples=len(ts)))
    out.sort(key=lambda m: (-(m.slope_bytes_per_s or 0.0), m.stage, m.rank, m.worker))
    return tuple(out[:MEMORY_WORKERS])
