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
from typing import TYPE_CHECKING, Any

import duckdb
from tlog.analyze.baseline import THROUGHPUT_UNITS, HighWaterMark, first_rate
from tlog.ingest.errors import RunNotFoundError

if TYPE_CHECKING:
    from tlog.analyze.rules import Policies
    from tlog.analyze.verdict import Diagnosis

#: Seconds of the run's latest iterations a live view diagnoses (its "now").
#: Source: tlog's choice: long enough to hold several iterations of a slow
#: loop (a few seconds each) and a queue's swings, short enough that a change
#: shows within half a minute.
DEFAULT_WINDOW_S = 30.0

#: Worker memory series a view keeps (those growing fastest first).
#: Source: tlog's choice (what fits a terminal).
MEMORY_WORKERS = 4

#: Findings read from the whole run's stored diagnosis: trends that a window
#: of half a minute cannot show (memory rising over hours, a slow drift).
#: Source: tlog's choice.
WHOLE_RUN_CODES = ("memory_growth", "drift")


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
    """One worker's memory over the window: RSS (the system samples'
    ``rss_bytes``) or device memory (their ``cuda_allocated``, else the
    iterations' ``mem.allocated``), the readings ``memory_growth`` reads.

    Attributes:
        stage, rank, worker: the worker.
        kind: ``"RSS"`` or ``"device memory"``.
        source: ``"sys samples"`` or ``"iterations' mem"``.
        first_bytes: its first reading of the run.
        latest_bytes: its latest reading in the window.
        peak_bytes: its highest reading in the window.
        rate_bytes_per_iter: the Theil-Sen slope of its readings against the
            iteration over the window's steady state (bytes per iteration, as
            ``memory_growth`` states it; None with fewer than 2 readings).
        samples: its readings in the window's steady state.
    """

    stage: str
    rank: int
    worker: str
    kind: str
    source: str
    first_bytes: int
    latest_bytes: int
    peak_bytes: int
    rate_bytes_per_iter: float | None
    samples: int


@dataclass(frozen=True)
class StoredFinding:
    """A finding of the whole run's stored diagnosis (``tlog diagnose``'s).

    Attributes:
        code, severity, message: as in ``tlog diagnose --json``'s ``findings``.
    """

    code: str
    severity: str
    message: str


@dataclass(frozen=True)
class WholeRun:
    """What the whole run's stored diagnosis says of the trends a window cannot
    see (:data:`WHOLE_RUN_CODES`), as of its last store (``tlog watch``'s
    follow loop stores it after its first round and at most every 120 s).

    Attributes:
        computed_at: epoch s of that store.
        iterations: the run's iterations then.
        findings: its findings of :data:`WHOLE_RUN_CODES`, in its order.
    """

    computed_at: float
    iterations: int
    findings: tuple[StoredFinding, ...]


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
            it/s the window reports (the order runs are ranked in;
            :func:`tlog.analyze.baseline.first_rate`); None when it reports
            none (no steady iteration yet).
        now: the window's steady throughput in :attr:`unit` (None when the
            window has no steady iteration yet).
        high_water: the best earlier run of the same configuration
            (:func:`tlog.analyze.baseline.high_water_mark`), or None when not
            looked up.
        queues: the latest depth of each logged queue in the window.
        memory: the memory trends (:class:`MemoryTrend`) of up to
            :data:`MEMORY_WORKERS` worker series, fastest growing first (empty
            without system samples or ``mem`` figures).
        whole_run: the stored whole-run diagnosis's trend findings
            (:class:`WholeRun`), or None before the first store.
        last_end: epoch s of the run's latest iteration end.
        as_of: epoch s when the view was computed.
        seconds: how long computing it took (s).
    """

    run_id: str
    iterations: int
    window: Window
    diagnosis: Diagnosis
    unit: str | None
    now: float | None
    high_water: HighWaterMark | None
    queues: tuple[QueueDepth, ...]
    memory: tuple[MemoryTrend, ...]
    whole_run: WholeRun | None
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
        key = next((k for k, u in THROUGHPUT_UNITS if u == self.unit), None)
        return self.high_water.value(key) if key else None

    @property
    def vs_high_water(self) -> float | None:
        """:attr:`now` over the high-water mark's throughput in the same unit
        (1.0: as fast), or None when either is missing."""
        hw = self.high_water_value
        if self.now is None or not hw:
            return None
        return self.now / hw

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``tlog serve``'s ``/api/runs/ID/live``): the run, the
        window (epoch s, counts), the throughput now, the window's verdict,
        ``stragglers`` (``tlog diagnose --json``'s items, over the window),
        the view's time and age (``as_of``, ``idle_s``) and ``diagnosis``:
        the whole window's ``tlog diagnose --json``. The high-water mark,
        queues and memory are left out (the run's own answers hold them)."""
        w = self.window
        d = self.diagnosis
        return {"run_id": self.run_id, "iterations": self.iterations,
                "window": {"since": w.since, "first": w.first, "until": w.until,
                           "seconds": w.seconds, "iterations": w.iterations,
                           "whole_run": w.whole_run},
                "unit": self.unit, "now": self.now, "verdict": d.verdict,
                "stragglers": [s.to_dict() for s in d.stragglers],
                "last_end": self.last_end, "as_of": self.as_of, "idle_s": self.idle_s,
                "seconds": self.seconds, "diagnosis": d.to_dict()}


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
              policies: Policies | None = None) -> LiveView:
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
        policies: the findings' limits (``Policies()`` when None).

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
    d = diagnose(con, run_id, policies=policies, since=since)
    n = d.iterations.total
    window = Window(since=since, first=float(d.analysis.iterations["ts"].min()), until=last_end,
                    iterations=n, whole_run=n == total)
    tp = d.throughput
    _, unit, now = first_rate({k: getattr(tp, k) for k, _ in THROUGHPUT_UNITS})
    return LiveView(run_id=run_id, iterations=total, window=window, diagnosis=d, unit=unit,
                    now=now, high_water=high_water, queues=_latest_queues(d),
                    memory=_memory(con, run_id, d), whole_run=stored_trends(con, run_id),
                    last_end=last_end, as_of=time.time(),
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


def stored_trends(con: duckdb.DuckDBPyConnection, run_id: str) -> WholeRun | None:
    """The :data:`WHOLE_RUN_CODES` findings of the run's stored diagnosis
    (``attribution_runs.diagnosis``, as last stored: not recomputed, which
    would diagnose the whole run), or None when none is stored."""
    import json

    try:
        rows = con.execute("SELECT epoch(computed_at), iterations, diagnosis::VARCHAR "
                           "FROM attribution_runs WHERE run_id = ?", [run_id]).fetchall()
    except duckdb.CatalogException:       # a database from before the stored diagnosis
        return None
    if not rows or rows[0][2] is None:
        return None
    at, n, text = rows[0]
    found = [StoredFinding(code=f["code"], severity=f["severity"], message=f["message"])
             for f in json.loads(text).get("findings", []) if f.get("code") in WHOLE_RUN_CODES]
    return WholeRun(computed_at=float(at), iterations=int(n or 0), findings=tuple(found))


def _memory(con: duckdb.DuckDBPyConnection, run_id: str, d: Diagnosis
            ) -> tuple[MemoryTrend, ...]:
    """Each worker's RSS and device memory over the window's steady state
    (the readings of ``memory_growth``, analyze.rules.machine), fastest
    growing first."""
    import numpy as np
    from tlog.analyze.statistics import theil_sen
    from tlog.analyze.system import steady_samples

    analysis = d.analysis
    samples = steady_samples(analysis)
    it = analysis.steady.select("wid", "iter", "mem_allocated")
    series: list[tuple[int, str, str, np.ndarray, np.ndarray]] = []
    for wid, g in samples.group_by("wid"):
        for kind, col in (("RSS", "rss_bytes"), ("device memory", "cuda_allocated")):
            r = g.drop_nulls(col)
            if r.height:
                series.append((int(wid[0]), kind, "sys samples", r["x"].to_numpy(),
                               r[col].to_numpy()))
    with_device = {w for w, k, *_ in series if k == "device memory"}
    for wid, g in it.drop_nulls("mem_allocated").group_by("wid"):
        if int(wid[0]) not in with_device:
            series.append((int(wid[0]), "device memory", "iterations' mem",
                           g["iter"].to_numpy(), g["mem_allocated"].to_numpy()))
    if not series:
        return ()
    firsts = _first_readings(con, run_id)
    names = {int(w): (str(st), int(r), str(wk)) for w, st, r, wk in analysis.data.workers
             .select("wid", "stage", "rank", "worker").iter_rows()}
    out = []
    for wid, kind, source, x, y in series:
        stage, rank, worker = names[wid]
        order = np.argsort(x, kind="stable")
        x, y = x[order].astype(np.float64), y[order].astype(np.float64)
        rate = float(theil_sen(x, y)[0]) if len(x) >= 2 and np.ptp(x) > 0 else None
        out.append(MemoryTrend(
            stage=stage, rank=rank, worker=worker, kind=kind, source=source,
            first_bytes=firsts.get((worker, kind, source), int(y[0])),
            latest_bytes=int(y[-1]), peak_bytes=int(y.max()), rate_bytes_per_iter=rate,
            samples=len(x)))
    out.sort(key=lambda m: (-(m.rate_bytes_per_iter or 0.0), m.stage, m.rank, m.worker, m.kind))
    return tuple(out[:MEMORY_WORKERS])


def _first_readings(con: duckdb.DuckDBPyConnection, run_id: str
                    ) -> dict[tuple[str, str, str], int]:
    """Each worker's first reading of the run, by ``(worker, kind, source)``
    (as :class:`MemoryTrend` names them): one grouped read of each table."""
    out: dict[tuple[str, str, str], int] = {}
    try:
        for worker, rss, dev in con.execute(
                "SELECT worker, arg_min(rss_bytes, ts) FILTER (rss_bytes IS NOT NULL), "
                "arg_min(cuda_allocated, ts) FILTER (cuda_allocated IS NOT NULL) "
                "FROM sys_samples WHERE run_id = ? GROUP BY worker", [run_id]).fetchall():
            for kind, v in (("RSS", rss), ("device memory", dev)):
                if v is not None:
                    out[(worker, kind, "sys samples")] = int(v)
    except duckdb.CatalogException:       # a database from before the system samples
        pass
    for worker, v in con.execute(
            "SELECT worker, arg_min(mem_allocated, ts) FROM iterations "
            "WHERE run_id = ? AND mem_allocated IS NOT NULL GROUP BY worker",
            [run_id]).fetchall():
        out[(worker, "device memory", "iterations' mem")] = int(v)
    return out
