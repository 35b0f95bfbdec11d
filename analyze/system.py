"""The machine a run had: its system samples and machine rows, read for analysis.

The shim samples, on its writer thread, the process's CPU time and RSS, the
machine's CPU count and load, the process's runnable threads and, on CUDA,
the allocator and the device (NVML) every ~2 s per worker (the ``sys``
record, docs/FORMAT.md); rank 0's ``meta`` names the machine. Ingest stores
them in ``sys_samples`` and ``machines`` (docs/DATABASE.md). This module:

- :func:`load_system`: one run's rows as a :class:`SystemData` (empty frames
  for a run without samples, or a database that predates the tables);
- :func:`steady_samples`: the samples of each worker that fall in its
  steady window, with the iteration they belong to;
- :func:`on_cpu_shares`: the recording thread's share of its compute time
  spent on a CPU, per worker (from the iterations' ``cpu`` field);
- :func:`run_queue_share`: the share of a worker's wall time its recording
  thread waited runnable for a CPU (the scheduler's run-queue delay, the
  samples' ``cpu_wait_s``): the direct evidence of CPU contention;
- :func:`process_cores`: the process's CPU use, in cores; :func:`cpu_percent`:
  the same between consecutive samples (the report's system panel);
- :func:`system_summary`: the run's environment and load figures
  (:class:`tlog.analyze.results.SystemSummary`), which ``tlog diagnose``
  reports (:func:`tlog.analyze.text.system_line`) and ``tlog compare`` sets side by side.

Units: seconds (``ts`` in the iterations' time base, epoch seconds), bytes,
percent for ``gpu_util``, MHz, watts, degrees Celsius.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import polars as pl
from tlog.analyze.results import MachineInfo, SystemSummary

if TYPE_CHECKING:
    from tlog.analyze.frames import RunAnalysis

#: The ``sys_samples`` columns analysis reads, with their types (docs/DATABASE.md).
SAMPLE_SCHEMA: dict[str, Any] = {
    "worker": pl.String, "ts": pl.Float64, "iter": pl.Int64, "cpu_s": pl.Float64,
    "rss_bytes": pl.Int64, "ncpu": pl.Int32, "load1": pl.Float64, "threads": pl.Int32,
    "running": pl.Int32, "cpu_wait_s": pl.Float64, "cuda_allocated": pl.Int64, "cuda_reserved": pl.Int64,
    "cuda_retries": pl.Int64, "cuda_limit": pl.Int64, "gpu_util": pl.Float64,
    "gpu_mem_used": pl.Int64, "gpu_mem_total": pl.Int64, "gpu_temp_c": pl.Float64,
    "gpu_sm_clock_mhz": pl.Float64, "gpu_sm_clock_max_mhz": pl.Float64,
    "gpu_power_w": pl.Float64, "gpu_throttle": pl.Int64,
}
#: The ``machines`` columns analysis reads.
MACHINE_SCHEMA: dict[str, Any] = {
    "worker": pl.String, "host": pl.String, "cpu_model": pl.String, "ncpu": pl.Int32,
    "mem_total": pl.Int64, "gpu_name": pl.String, "gpu_count": pl.Int32,
    "driver": pl.String, "cuda": pl.String,
}


@dataclass
class SystemData:
    """One run's system samples and machine rows.

    Attributes:
        samples: ``sys_samples`` rows (:data:`SAMPLE_SCHEMA` columns), by worker and ts.
        machines: ``machines`` rows (:data:`MACHINE_SCHEMA` columns).
    """

    samples: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=SAMPLE_SCHEMA))
    machines: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=MACHINE_SCHEMA))


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ? "
                            "AND NOT internal", [name]).fetchall()[0][0])


def _select(con: duckdb.DuckDBPyConnection, table: str, schema: dict[str, Any],
            run_id: str, order: str, since: float | None = None) -> pl.DataFrame:
    window = "" if since is None else " AND ts >= $since"
    params: dict[str, Any] = {"run": run_id} if since is None else {"run": run_id,
                                                                    "since": since}

    def read(cols: str) -> pl.DataFrame:
        rows = con.sql(f"SELECT {cols} FROM {table} WHERE run_id = $run{window} "
                       f"ORDER BY {order}", params=params).to_arrow_table()
        return pl.from_arrow(rows).cast(schema)  # type: ignore[return-value]

    try:    # the current schema: every column there (no catalog queries first)
        return read(", ".join(f'"{c}"' for c in schema))
    except (duckdb.CatalogException, duckdb.BinderException):
        pass
    if not _has_table(con, table):    # a database from before the table or a column
        return pl.DataFrame(schema=schema)
    have = {r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = ?", [table]).fetchall()}
    return read(", ".join(f'"{c}"' if c in have else f'NULL AS "{c}"' for c in schema))


def load_system(con: duckdb.DuckDBPyConnection, run_id: str,
                since: float | None = None) -> SystemData:
    """The run's ``sys_samples`` (by worker, ts) and ``machines`` rows; with
    ``since`` (a window, :func:`tlog.analyze.load.load_run`) only the samples
    taken at or after it.

    A database without those tables (written before they existed) or a run
    without samples gives empty frames: every rule that reads them then
    finds nothing. Read-only connections are enough.
    """
    return SystemData(
        samples=_select(con, "sys_samples", SAMPLE_SCHEMA, run_id, "worker, ts", since),
        machines=_select(con, "machines", MACHINE_SCHEMA, run_id, "worker"))


def steady_samples(analysis: RunAnalysis) -> pl.DataFrame:
    """The system samples inside each worker's steady window.

    A worker's steady window runs from the start of its first steady
    iteration to the end of its last; a sample belongs to the workers of the
    run whose ``worker`` name it carries. ``x`` is the iteration the sample
    was taken in: its ``iter`` field (the last iteration started), else the
    iteration whose span holds its ``ts`` (interpolated over the worker's
    iterations).

    Returns:
        :data:`SAMPLE_SCHEMA` columns plus ``wid``, ``stage``, ``rank``,
        ``x`` (Float64), sorted by ``wid, ts``; empty without samples.
        Computed once per ``analysis`` (every machine rule reads it).
    """
    if analysis._steady_samples is None:
        analysis._steady_samples = _steady_samples(analysis)
    return analysis._steady_samples


def _steady_samples(analysis: RunAnalysis) -> pl.DataFrame:
    samples = analysis.data.system.samples
    extra = {"wid": pl.Int64, "stage": pl.String, "rank": pl.Int32, "x": pl.Float64}
    empty = pl.DataFrame(schema={**SAMPLE_SCHEMA, **extra})
    if samples.height == 0:
        return empty
    by_worker = samples.partition_by("worker", as_dict=True)
    it = analysis.iterations
    steady = it["steady"].to_numpy()
    ts, dur, iters = it["ts"].to_numpy(), it["dur"].to_numpy(), it["iter"].to_numpy()
    workers = analysis.data.workers.with_columns(pl.col("worker").cast(pl.String),
                                                 pl.col("stage").cast(pl.String))
    names = dict(zip(workers["wid"].to_list(), workers.select("worker", "stage", "rank")
                     .iter_rows(), strict=True))
    parts = []
    for wid, a, b in analysis.slices:
        m = steady[a:b]
        if not m.any() or wid not in names:
            continue
        worker, stage, rank = names[wid]
        lo, hi = float(ts[a:b][m].min()), float((ts[a:b] + dur[a:b])[m].max())
        s = by_worker.get((worker,))
        if s is None:
            continue
        s = s.filter(pl.col("ts").is_between(lo, hi))
        if s.height == 0:
            continue
        order = np.argsort(ts[a:b], kind="stable")
        guess = np.interp(s["ts"].to_numpy(), ts[a:b][order], iters[a:b][order].astype(float))
        x = np.where(s["iter"].is_null().to_numpy(), guess,
                     s["iter"].fill_null(0).to_numpy().astype(float))
        parts.append(s.with_columns(wid=pl.lit(wid, pl.Int64), stage=pl.lit(stage, pl.String),
                                    rank=pl.lit(rank, pl.Int32), x=pl.Series(x, dtype=pl.Float64)))
    if not parts:
        return empty
    return pl.concat(parts, how="vertical_relaxed").sort("wid", "ts")


def on_cpu_shares(analysis: RunAnalysis, workers: pl.DataFrame) -> list[dict[str, Any]]:
    """The recording thread's share of its compute time spent on a CPU, per worker.

    Per worker of ``workers`` (``analyze.pipeline.worker_table``) with
    ``cpu`` recorded, over its steady iterations that carry ``cpu``:
    ``wall`` is their wall time, ``busy`` the wall time minus the waiting
    categories (starvation, backpressure, sync) and unaccounted time, i.e.
    the compute phases, and ``on_cpu = min(cpu / busy, 1)``. A thread off the
    CPU inside compute is blocked (a read, a sleep, a lock, the GIL) or
    runnable without a core (contention); ``cpu`` is thread CPU time
    (``time.thread_time``), so it cannot tell which: :func:`run_queue_share`
    can.

    Returns:
        One dict per such worker, in ``workers`` order: the worker row
        (``w``), ``n`` (iterations with cpu), ``wall``, ``busy``, ``cpu``
        (seconds) and ``on_cpu`` (0..1). Workers with no busy time are left out.
    """
    if not any(workers["cpu_dur"].to_list()):
        return []       # no worker recorded cpu: nothing of the run's arrays is read
    it = analysis.iterations
    steady = it["steady"].to_numpy()
    cpu = it["cpu"].fill_null(0).to_numpy()
    cpu_ok = it["cpu"].is_not_null().to_numpy()
    dur = it["dur"].to_numpy()
    waits = sum(it[c].to_numpy() for c in ("starvation_s", "backpressure_s", "sync_s",
                                           "unaccounted_s"))
    bounds = {wid: (a, b) for wid, a, b in analysis.slices}
    out = []
    for w in workers.iter_rows(named=True):
        if not w["cpu_dur"] or w["wid"] not in bounds:
            continue
        a, b = bounds[w["wid"]]
        m = steady[a:b] & cpu_ok[a:b]
        wall = float(dur[a:b][m].sum())
        busy = wall - float(waits[a:b][m].sum())
        if wall <= 0 or busy <= 0:
            continue
        used = float(cpu[a:b][m].sum())
        out.append({"w": w, "n": int(m.sum()), "wall": wall, "busy": busy, "cpu": used,
                    "on_cpu": min(used / busy, 1.0)})
    return out


def run_queue_share(samples: pl.DataFrame) -> float | None:
    """The share of wall time one worker's recording thread spent runnable but
    waiting for a CPU, over its samples (0..1; None with fewer than two
    samples carrying ``cpu_wait_s``: a log from before the field, or not Linux).

    ``cpu_wait_s`` is the scheduler's cumulative run-queue delay of the
    threads that ran the worker's iterations (``/proc/self/task/<tid>/schedstat``
    field 2, dflash_runtime/sysinfo.py): the seconds they were ready to run
    with no core free. A thread asleep, in I/O, on a lock or waiting for the
    GIL (CPython parks it on a condition variable) is not runnable and adds
    nothing to it. The share is the sum of its rises between consecutive
    samples (a fall, when a thread that ran iterations ended, counts as no
    rise) over the seconds between the first and last of them, capped at 1
    (several threads that ran iterations can wait at once).
    """
    c = samples.filter(pl.col("cpu_wait_s").is_not_null()).sort("ts")
    if c.height < 2 or c["ts"][-1] <= c["ts"][0]:
        return None
    rises = np.clip(np.diff(c["cpu_wait_s"].to_numpy()), 0.0, None)
    return min(float(rises.sum()) / float(c["ts"][-1] - c["ts"][0]), 1.0)


def process_cores(samples: pl.DataFrame) -> float | None:
    """The process's CPU use over one worker's samples, in cores: CPU seconds
    gained (``cpu_s``) per second between its first and last sample; None with
    fewer than two samples carrying ``cpu_s``."""
    c = samples.filter(pl.col("cpu_s").is_not_null()).sort("ts")
    if c.height < 2 or c["ts"][-1] <= c["ts"][0]:
        return None
    return float((c["cpu_s"][-1] - c["cpu_s"][0]) / (c["ts"][-1] - c["ts"][0]))


def cpu_percent(samples: pl.DataFrame) -> pl.DataFrame:
    """``samples`` (:data:`SAMPLE_SCHEMA`) sorted by worker and ts, plus ``cpu_pct``:
    the process's CPU use since the worker's previous sample, percent of one core
    (100 * delta ``cpu_s`` / delta ``ts``; 250 = two and a half cores busy).

    Null for a worker's first sample, after a sample without ``cpu_s``, when
    ``ts`` did not advance, or when ``cpu_s`` went down (a restarted process
    writing under the same worker name).
    """
    d_cpu = pl.col("cpu_s") - pl.col("cpu_s").shift(1).over("worker")
    d_ts = pl.col("ts") - pl.col("ts").shift(1).over("worker")
    pct = pl.when((d_ts > 0) & (d_cpu >= 0)).then(100.0 * d_cpu / d_ts).otherwise(None)
    return samples.sort("worker", "ts", maintain_order=True).with_columns(
        pct.cast(pl.Float64).alias("cpu_pct"))


def _median(s: pl.Series) -> float | None:
    s = s.drop_nulls()
    return float(s.median()) if s.len() else None  # type: ignore[arg-type]


#: NVML clocks-event reasons that slow a busy GPU down (``nvmlClocksEventReasons``):
#: SW power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power
#: brake 0x80. Idle (0x1), application clocks (0x2), sync boost (0x10) and
#: display clocks (0x100) are not a slowdown of work. Source: NVML's
#: ``nvml.h`` (``nvmlClocksEventReasonSwPowerCap`` ...).
THROTTLE_REASONS: dict[int, str] = {
    0x4: "software power cap", 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown", 0x80: "hardware power brake",
}
#: The mask of :data:`THROTTLE_REASONS`.
THROTTLE_MASK = sum(THROTTLE_REASONS)


def throttle_names(mask: int) -> list[str]:
    """The slowdown reasons set in an NVML clocks-event mask, in bit order."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def machine_info(machines: pl.DataFrame) -> MachineInfo | None:
    """The run's machine (:class:`MachineInfo`) from its ``machines`` rows, or
    None without rows. Several hosts or models: each field lists the distinct
    values, sorted, joined by ``", "``; counts are the smallest seen."""
    if machines.height == 0:
        return None

    def text(col: str) -> str | None:
        vals = sorted({str(v) for v in machines[col].drop_nulls().to_list()})
        return ", ".join(vals) if vals else None

    def least(col: str) -> int | None:
        s = machines[col].drop_nulls()
        return int(s.min()) if s.len() else None  # type: ignore[arg-type]

    return MachineInfo(host=text("host"), cpu_model=text("cpu_model"), ncpu=least("ncpu"),
                       mem_total=least("mem_total"), gpu_name=text("gpu_name"),
                       gpu_count=least("gpu_count"), driver=text("driver"), cuda=text("cuda"))


def system_summary(analysis: RunAnalysis, workers: pl.DataFrame) -> SystemSummary:
    """The run's environment and load over its steady state (:class:`SystemSummary`).

    Medians over every steady sample of every worker (``steady_samples``);
    process CPU use is the median over workers of each one's CPU seconds
    gained over its steady window divided by the window's length (cores);
    ``on_cpu_share`` is the lowest :func:`on_cpu_shares` of the run's workers
    (None without ``cpu``); ``run_queue_share`` the highest
    :func:`run_queue_share` of the run's workers (None without ``cpu_wait_s``);
    ``throttled_share`` is the share of samples with a :data:`THROTTLE_REASONS`
    bit set.
    """
    s = steady_samples(analysis)
    shares = on_cpu_shares(analysis, workers)
    on_cpu = min((f["on_cpu"] for f in shares), default=None)
    cores = [c for _, g in s.group_by("wid") if (c := process_cores(g)) is not None]
    waits = [q for _, g in s.group_by("wid") if (q := run_queue_share(g)) is not None]
    thr = s["gpu_throttle"].drop_nulls()
    usable = s["ncpu"].drop_nulls()
    return SystemSummary(
        machine=machine_info(analysis.data.system.machines),
        samples=s.height,
        ncpu=int(usable.min()) if usable.len() else None,  # type: ignore[arg-type]
        load1=_median(s["load1"]),
        running=_median(s["running"]),
        process_cpu_cores=float(np.median(cores)) if cores else None,
        on_cpu_share=on_cpu,
        run_queue_share=max(waits) if waits else None,
        rss_bytes=_median(s["rss_bytes"]),
        gpu_util=_median(s["gpu_util"]),
        gpu_sm_clock_mhz=_median(s["gpu_sm_clock_mhz"]),
        gpu_sm_clock_max_mhz=_median(s["gpu_sm_clock_max_mhz"]),
        throttled_share=(float(((thr & THROTTLE_MASK) > 0).mean()) if thr.len() else None))
