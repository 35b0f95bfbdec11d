"""The machine as evidence: a run's ``sys_samples`` and ``machines`` rows as frames.

One definition of reading them, for findings, comparisons and the report's
system panel. The rows come from the shim's ``sys`` records and from a
torch.profiler trace's device ``[memory]`` events (docs/DATABASE.md "sys_samples",
docs/FORMAT.md ``sys``); a column is null where the record did not measure it.
Units: seconds, epoch seconds (``ts``, the time base of ``iterations.ts``), bytes.
"""

from __future__ import annotations

import duckdb
import polars as pl

#: Columns of :func:`load_sys_samples` (``sys_samples`` without file, line, extra).
SYS_COLUMNS: tuple[str, ...] = (
    "worker", "ts", "iter", "cpu_s", "rss_bytes", "ncpu", "load1", "threads", "running",
    "cuda_allocated", "cuda_reserved", "cuda_retries", "cuda_limit", "gpu_util",
    "gpu_mem_used", "gpu_mem_total", "gpu_temp_c", "gpu_sm_clock_mhz", "gpu_sm_clock_max_mhz",
    "gpu_power_w", "gpu_throttle",
)
#: Columns of :func:`load_machines`.
MACHINE_COLUMNS: tuple[str, ...] = (
    "worker", "host", "cpu_model", "ncpu", "mem_total", "gpu_name", "gpu_count", "driver", "cuda",
)

_SYS_SCHEMA = {
    "worker": pl.String, "ts": pl.Float64, "iter": pl.Int64, "cpu_s": pl.Float64,
    "rss_bytes": pl.Int64, "ncpu": pl.Int32, "load1": pl.Float64, "threads": pl.Int32,
    "running": pl.Int32, "cuda_allocated": pl.Int64, "cuda_reserved": pl.Int64,
    "cuda_retries": pl.Int64, "cuda_limit": pl.Int64, "gpu_util": pl.Float64,
    "gpu_mem_used": pl.Int64, "gpu_mem_total": pl.Int64, "gpu_temp_c": pl.Float64,
    "gpu_sm_clock_mhz": pl.Float64, "gpu_sm_clock_max_mhz": pl.Float64,
    "gpu_power_w": pl.Float64, "gpu_throttle": pl.Int64,
}
_MACHINE_SCHEMA = {
    "worker": pl.String, "host": pl.String, "cpu_model": pl.String, "ncpu": pl.Int32,
    "mem_total": pl.Int64, "gpu_name": pl.String, "gpu_count": pl.Int32, "driver": pl.String,
    "cuda": pl.String,
}


def _table_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables "
                            "WHERE table_name = ?", [name]).fetchall()[0][0])


def _load(con: duckdb.DuckDBPyConnection, sql: str, params: list, schema: dict) -> pl.DataFrame:
    cur = con.cursor()
    try:
        got = pl.from_arrow(cur.sql(sql, params=params).to_arrow_table())
    finally:
        cur.close()
    if not isinstance(got, pl.DataFrame) or got.height == 0:
        return pl.DataFrame(schema=schema)
    return got.cast(schema)  # type: ignore[arg-type]


def load_sys_samples(con: duckdb.DuckDBPyConnection, run_id: str, *,
                     since: float | None = None) -> pl.DataFrame:
    """The run's system samples, one row per sample, ordered by worker and ``ts``.

    Args:
        con: the tlog database (read-only is enough; a database older than
            schema 6, opened read-only, has no such table: an empty frame).
        run_id: the run.
        since: only samples with ``ts`` at or after it (epoch s).

    Returns:
        :data:`SYS_COLUMNS` (types of docs/DATABASE.md; null: not measured).
    """
    if not _table_exists(con, "sys_samples"):
        return pl.DataFrame(schema=_SYS_SCHEMA)
    where = "run_id = ?" + (" AND ts >= ?" if since is not None else "")
    params: list = [run_id] + ([since] if since is not None else [])
    return _load(con, f"SELECT {', '.join(SYS_COLUMNS)} FROM sys_samples WHERE {where} "
                      f"ORDER BY worker, ts, line", params, _SYS_SCHEMA)


def load_machines(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """The run's ``machines`` rows (one per worker that described its machine),
    :data:`MACHINE_COLUMNS`, ordered by worker; empty before schema 6."""
    if not _table_exists(con, "machines"):
        return pl.DataFrame(schema=_MACHINE_SCHEMA)
    return _load(con, f"SELECT {', '.join(MACHINE_COLUMNS)} FROM machines WHERE run_id = ? "
                      f"ORDER BY worker", [run_id], _MACHINE_SCHEMA)


def with_cpu_percent(samples: pl.DataFrame) -> pl.DataFrame:
    """``samples`` (:func:`load_sys_samples`) plus ``cpu_pct``: the process's CPU
    use since the worker's previous sample, percent of one core
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
