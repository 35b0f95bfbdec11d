"""Load one run from the tlog database into the frames and arrays analysis uses.

:func:`load_run` reads the ``runs``, ``iterations``, ``phases``,
``queue_samples`` and ``events`` tables of one run (``ingest/db.py`` documents
their columns) and returns a :class:`RunData`.

Speed is the point of the layout (DESIGN.md "Budgets": diagnose 1M iteration
records in under 1 s). The phase table of such a run holds ~6M rows; strings
are never carried per row. DuckDB hashes the worker key and the phase name
(``hash()``, 64-bit) and the categories arrive as small integer codes; the
phase rows are then tied to their iteration by an integer index (``ix``) into
the iterations frame, with numpy gathers, not joins. Phase rows keep DuckDB's
scan order (``preserve_insertion_order``, on by default: the order ingest wrote
them, record by record, ``seq`` ascending); :func:`load_run` checks that every
iteration's phases are contiguous and ``seq``-ordered and sorts them when not.

Units: seconds and epoch seconds (DOUBLE), bytes (BIGINT), as in the database.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl

from ingest.categories import CATEGORIES, Category
from ingest.errors import RunNotFoundError

#: Integer code of each category in :attr:`PhaseRows.cat` (the index in CATEGORIES).
CAT_CODE: dict[str, int] = {name: i for i, name in enumerate(CATEGORIES)}
STARVATION, BACKPRESSURE, COMPUTE, SYNC, UNACCOUNTED = (
    CAT_CODE[c.value] for c in (Category.STARVATION, Category.BACKPRESSURE, Category.COMPUTE,
                                Category.SYNC, Category.UNACCOUNTED))


@dataclass(frozen=True)
class PhaseRows:
    """The phase rows of a run as parallel numpy arrays (one element per row).

    Rows of one iteration are contiguous and in ``seq`` order. Only top-level
    phases (``parent IS NULL``) are here; children live in
    :attr:`RunData.children`.

    Attributes:
        ix: int64, index of the row's iteration in :attr:`RunData.iterations`.
        seq: int32, the phase's position within its iteration.
        pid: int32, index of the phase name in :attr:`RunData.phase_names`.
        cat: int8, category code (:data:`CAT_CODE`) from the host rules.
        host: float64 seconds of host wall time (0 for a gpu-only key).
        gpu: float64 seconds of device time (0 when not measured).
        has_gpu: bool, a device time was recorded for the row.
    """

    ix: np.ndarray
    seq: np.ndarray
    pid: np.ndarray
    cat: np.ndarray
    host: np.ndarray
    gpu: np.ndarray
    has_gpu: np.ndarray

    def __len__(self) -> int:
        return len(self.ix)


@dataclass
class RunData:
    """Everything analysis reads about one run.

    Attributes:
        run_id: the run's id.
        run: the ``runs`` row as a dict (``tags``, ``config``, ``phase_kinds``
            decoded from JSON; missing fields ``None``).
        iterations: one row per iteration, sorted by (stage, rank, worker, iter),
            with ``ix`` (0..n-1, the row index) and ``wid`` (worker index into
            :attr:`workers`); columns rank, stage, worker, iter, ts, dur, cpu,
            tokens, samples, mem_allocated, mem_reserved, mem_alloc_retries,
            mem_device_allocs.
        workers: one row per worker: wid, rank, stage, worker (sorted as above).
        phase_names: the run's distinct phase names; ``PhaseRows.pid`` indexes it.
        phases: top-level phase rows (:class:`PhaseRows`).
        children: child phases (``a/b``), one row per phase occurrence:
            ix, phase, parent, host_s, gpu_s, category (a polars frame; small
            in practice, so kept as strings).
        queues: queue depth samples: rank, stage, worker, name, ts, depth, capacity.
        events: rank, stage, worker, name, ts, dur.
    """

    run_id: str
    run: dict[str, Any]
    iterations: pl.DataFrame
    workers: pl.DataFrame
    phase_names: list[str]
    phases: PhaseRows
    children: pl.DataFrame
    queues: pl.DataFrame
    events: pl.DataFrame
    notes: list[str] = field(default_factory=list)


_RUN_COLUMNS = ("run_id", "name", "source", "root", "started", "world_size", "tags", "config",
                "phase_kinds")

_ITER_SQL = """
SELECT rank, stage, worker, hash(rank, stage, worker) AS wk, iter, ts, dur, cpu, tokens, samples,
       mem_allocated, mem_reserved, mem_alloc_retries, mem_device_allocs
FROM iterations WHERE run_id = $run
"""
# Category codes follow ingest.categories.CATEGORIES (starvation, backpressure, compute, sync).
_PHASE_SQL = """
SELECT hash(rank, stage, worker) AS wk, iter, seq::INTEGER AS seq, hash(phase) AS ph,
       coalesce(host_s, 0.0) AS host, coalesce(gpu_s, 0.0) AS gpu, gpu_s IS NOT NULL AS has_gpu,
       (CASE category WHEN 'starvation' THEN 0 WHEN 'backpressure' THEN 1
                      WHEN 'sync' THEN 3 ELSE 2 END)::TINYINT AS cat
FROM phases WHERE run_id = $run AND parent IS NULL
"""
_PHASE_NAMES_SQL = """
SELECT DISTINCT phase, hash(phase) AS ph FROM phases WHERE run_id = $run AND parent IS NULL
"""
_CHILD_SQL = """
SELECT hash(rank, stage, worker) AS wk, iter, seq, phase, parent, host_s, gpu_s, category
FROM phases WHERE run_id = $run AND parent IS NOT NULL
"""


def _frame(con: duckdb.DuckDBPyConnection, sql: str, run_id: str) -> pl.DataFrame:
    return pl.from_arrow(con.sql(sql, params={"run": run_id}).to_arrow_table())


def _run_row(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    cols = ", ".join(_RUN_COLUMNS)
    rows = con.sql(f"SELECT {cols} FROM runs WHERE run_id = $run",
                   params={"run": run_id}).fetchall()
    row = rows[0] if rows else None
    if row is None:
        has_iters = con.sql("SELECT count(*) FROM iterations WHERE run_id = $run",
                            params={"run": run_id}).fetchall()[0][0]
        if not has_iters:
            msg = f"no run {run_id!r} in the database: 'tlog runs' lists the run ids"
            raise RunNotFoundError(msg)
        row = (run_id,) + (None,) * (len(_RUN_COLUMNS) - 1)
    out = dict(zip(_RUN_COLUMNS, row, strict=True))
    for key in ("tags", "config", "phase_kinds"):
        value = out.get(key)
        if isinstance(value, str):
            try:
                out[key] = json.loads(value)
            except ValueError:
                out[key] = None
    return out


def _index_of(keys: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Position of each of ``keys`` in the unique array ``table`` (-1 if absent)."""
    order = np.argsort(table, kind="stable")
    sorted_table = table[order]
    pos = np.searchsorted(sorted_table, keys)
    pos = np.minimum(pos, len(sorted_table) - 1)
    found = sorted_table[pos] == keys
    return np.where(found, order[pos], -1)


def _iteration_index(wid: np.ndarray, it: np.ndarray, iters: pl.DataFrame,
                     n_workers: int) -> np.ndarray:
    """Map (worker index, iter) pairs to the row index of ``iters`` (-1 if absent).

    Iteration numbers of a worker are usually dense (0..n-1, some gaps), so a
    per-worker lookup table indexed by ``iter - min`` gives the row with two
    gathers. Sparse numbering (a span over 4x the count) uses a sorted search.
    """
    i_wid = iters["wid"].to_numpy()
    i_it = iters["iter"].to_numpy()
    lo = np.full(n_workers, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(n_workers, -1, dtype=np.int64)
    np.minimum.at(lo, i_wid, i_it)
    np.maximum.at(hi, i_wid, i_it)
    span = np.where(hi >= lo, hi - lo + 1, 0)
    if span.sum() <= 4 * max(len(iters), 1) + 1024:
        base = np.concatenate([[0], np.cumsum(span)[:-1]])
        table = np.full(int(span.sum()), -1, dtype=np.int64)
        table[base[i_wid] + (i_it - lo[i_wid])] = np.arange(len(iters), dtype=np.int64)
        ok = (wid >= 0) & (it >= lo[np.maximum(wid, 0)]) & (it <= hi[np.maximum(wid, 0)])
        safe_wid = np.where(ok, wid, 0)
        slot = np.where(ok, base[safe_wid] + (it - lo[safe_wid]), 0)
        return np.where(ok, table[slot] if len(table) else -1, -1)
    key_iters = i_wid.astype(np.int64) * (1 << 40) + i_it
    key_rows = wid.astype(np.int64) * (1 << 40) + it
    return _index_of(key_rows, key_iters)


def _order_rows(ix: np.ndarray, seq: np.ndarray) -> np.ndarray | None:
    """``None`` when the rows of each iteration are contiguous and ``seq``-ordered
    (the scan order ingest produces), else the permutation that makes them so."""
    n = len(ix)
    if n == 0:
        return None
    new_run = np.empty(n, dtype=bool)
    new_run[0] = True
    np.not_equal(ix[1:], ix[:-1], out=new_run[1:])
    in_order = bool(np.all(seq[1:][~new_run[1:]] > seq[:-1][~new_run[1:]]))
    if in_order:
        runs = int(new_run.sum())
        distinct = int(np.count_nonzero(np.bincount(ix)))
        if runs == distinct:
            return None
    return np.lexsort((seq, ix))


def load_run(con: duckdb.DuckDBPyConnection, run_id: str) -> RunData:
    """Read one run's tables into a :class:`RunData`.

    Args:
        con: an open tlog database (``ingest.db.connect``), read-only is enough.
        run_id: the run to load.

    Reads through its own cursor (``con.cursor()``), so a result the caller
    left unfinished on ``con`` (DuckDB 2 refuses new work on it) is no matter.

    Raises:
        RunNotFoundError: no such run, or it holds no iterations.
    """
    cur = con.cursor()
    try:
        return _load(cur, run_id)
    finally:
        cur.close()


def _load(con: duckdb.DuckDBPyConnection, run_id: str) -> RunData:
    run = _run_row(con, run_id)
    it = _frame(con, _ITER_SQL, run_id)
    if it.height == 0:
        msg = (f"run {run_id!r} holds no iterations: ingest its log files "
               f"('tlog ingest RUN_DIR') before diagnosing it")
        raise RunNotFoundError(msg)
    it = it.sort(["stage", "rank", "worker", "iter"])
    workers = (it.select("stage", "rank", "worker", "wk").unique(maintain_order=True)
               .with_row_index("wid").with_columns(pl.col("wid").cast(pl.Int32)))
    it = (it.join(workers.select("wk", "wid"), on="wk", how="left", maintain_order="left")
          .with_row_index("ix").with_columns(pl.col("ix").cast(pl.Int64)))
    w_keys = workers["wk"].to_numpy()

    ph = _frame(con, _PHASE_SQL, run_id)
    names = _frame(con, _PHASE_NAMES_SQL, run_id).sort("phase")
    phase_names = names["phase"].to_list()
    name_keys = names["ph"].to_numpy()
    notes: list[str] = []
    if len(np.unique(name_keys)) != len(name_keys):  # a 64-bit hash collision: never seen
        msg = f"run {run_id!r}: two phase names share a hash; rename one of them"
        raise RunNotFoundError(msg)

    if ph.height:
        wid = _index_of(ph["wk"].to_numpy(), w_keys).astype(np.int64)
        ix = _iteration_index(wid, ph["iter"].to_numpy().astype(np.int64), it, len(workers))
        seq = ph["seq"].to_numpy()
        keep = ix >= 0
        if not keep.all():
            notes.append(f"{int((~keep).sum())} phase rows had no iteration row and were left out")
        pid = _index_of(ph["ph"].to_numpy(), name_keys).astype(np.int32)
        cols = {
            "ix": ix, "seq": seq.astype(np.int32), "pid": pid,
            "cat": ph["cat"].to_numpy().astype(np.int8),
            "host": ph["host"].to_numpy().astype(np.float64),
            "gpu": ph["gpu"].to_numpy().astype(np.float64),
            "has_gpu": ph["has_gpu"].to_numpy().astype(bool),
        }
        if not keep.all():
            cols = {k: v[keep] for k, v in cols.items()}
        order = _order_rows(cols["ix"], cols["seq"])
        if order is not None:
            cols = {k: v[order] for k, v in cols.items()}
        phases = PhaseRows(**cols)
    else:
        empty = np.empty(0)
        phases = PhaseRows(ix=empty.astype(np.int64), seq=empty.astype(np.int32),
                           pid=empty.astype(np.int32), cat=empty.astype(np.int8),
                           host=empty, gpu=empty, has_gpu=empty.astype(bool))

    ch = _frame(con, _CHILD_SQL, run_id)
    if ch.height:
        cwid = _index_of(ch["wk"].to_numpy(), w_keys).astype(np.int64)
        cix = _iteration_index(cwid, ch["iter"].to_numpy().astype(np.int64), it, len(workers))
        children = (ch.with_columns(ix=pl.Series(cix, dtype=pl.Int64))
                    .filter(pl.col("ix") >= 0)
                    .select("ix", "seq", "phase", "parent", "host_s", "gpu_s", "category"))
    else:
        children = pl.DataFrame(schema={"ix": pl.Int64, "seq": pl.Int32, "phase": pl.String,
                                        "parent": pl.String, "host_s": pl.Float64,
                                        "gpu_s": pl.Float64, "category": pl.String})

    queues = _frame(con, "SELECT rank, stage, worker, name, ts, depth, capacity "
                         "FROM queue_samples WHERE run_id = $run ORDER BY name, ts", run_id)
    events = _frame(con, "SELECT rank, stage, worker, name, ts, dur "
                         "FROM events WHERE run_id = $run ORDER BY ts", run_id)
    return RunData(run_id=run_id, run=run, iterations=it.drop("wk"),
                   workers=workers.drop("wk"), phase_names=phase_names, phases=phases,
                   children=children, queues=queues, events=events, notes=notes)
