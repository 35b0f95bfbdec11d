"""Load one run from the tlog database into the frames and arrays analysis uses.

:func:`load_run` reads one run's ``runs`` row, its ``iterations`` (with the
per-iteration phase time lists of schema v2), its ``phase_layouts``, its
``queue_samples`` and ``events`` (``ingest/db.py`` documents the columns), and
returns a :class:`RunData`.

Speed is the point of the layout (DESIGN.md "Budgets": diagnose 1M iteration
records in under 1 s). Schema v2 stores each iteration's phase times as two
lists (``phase_host_s``, ``phase_gpu_s``) in the order of its *layout* (the
run's distinct phase-name sequences, in ``phase_layouts``). They arrive
through Arrow as one flat float array plus offsets, without a copy or a join;
the analysis then works layout by layout on dense ``iterations x phases``
matrices (``analyze.attribution``). No string is carried per phase.

Units: seconds and epoch seconds (float64), bytes (int64), as in the database.
"""

from __future__ import annotations

import itertools
import json
import mmap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from tlog.analyze.gaps import absorb_gaps, pauses_note
from tlog.analyze.system import SystemData, load_system
from tlog.ingest.errors import DatabaseError, RunNotFoundError
from tlog.ingest.kineto import stored_warnings
from tlog.ingest.run import stored_shim_drops
from tlog.ingest.timer_logs import stored_intervals
from tlog.ingest.timer_logs import stored_notes as timer_log_notes

from dflash_runtime.format import CATEGORIES, MAX_DURATION_S, Category

#: Integer code of each category (its index in ``dflash_runtime.format.CATEGORIES``).
CAT_CODE: dict[str, int] = {name: i for i, name in enumerate(CATEGORIES)}
STARVATION, BACKPRESSURE, COMPUTE, SYNC, UNACCOUNTED = (
    CAT_CODE[c.value] for c in (Category.STARVATION, Category.BACKPRESSURE, Category.COMPUTE,
                                Category.SYNC, Category.UNACCOUNTED))
#: The pseudo-phase name of an iteration's time in no phase, wherever a phase
#: is named: compare's contributors, drift, a straggler's excess.
UNACCOUNTED_PHASE = "(unaccounted)"


@dataclass(frozen=True)
class Layout:
    """One phase layout of a run: the phase at each list position.

    Attributes:
        layout: the layout id (``phase_layouts.layout``).
        pid: int32 per position, index into :attr:`RunData.phase_names`.
        cat: int8 per position, category code (:data:`CAT_CODE`, host rules).
        top: bool per position, a top-level phase (no ``/`` parent).
        parent: per position, the parent name or None.
    """

    layout: int
    pid: np.ndarray
    cat: np.ndarray
    top: np.ndarray
    parent: list[str | None]

    def __len__(self) -> int:
        return len(self.pid)


@dataclass(frozen=True)
class PhaseTimes:
    """Phase times of every iteration, flat, as stored (schema v2 lists).

    Row ``i`` of :attr:`RunData.iterations` has ``src = iterations["src"][i]``;
    its host times are ``host[host_start[src] : host_start[src] + length[src]]``
    in its layout's order, its device times ``gpu[gpu_start[src] + k]``
    (``gpu_start[src] == -1``: none measured in that iteration).

    Attributes:
        host: float64 seconds (0 where null: a gpu-only key).
        host_start: per source row; int32 (int64 from 2^31 values of :attr:`host` on).
        length: int32 per source row (0 without phases).
        gpu: float64 seconds (0 where null).
        gpu_valid: bool per element of :attr:`gpu`, a device time was measured.
        gpu_start: per source row, -1 for a null list; int32 (int64 from 2^31
            values of :attr:`gpu` on).
    """

    host: np.ndarray
    host_start: np.ndarray
    length: np.ndarray
    gpu: np.ndarray
    gpu_valid: np.ndarray
    gpu_start: np.ndarray


@dataclass
class RunData:
    """Everything analysis reads about one run.

    Attributes:
        run_id: the run's id.
        run: the ``runs`` row as a dict (``tags``, ``config``, ``phase_kinds``
            decoded from JSON; fields missing from the database are None).
        iterations: one row per iteration sorted by (stage, rank, worker, iter):
            ``wid`` (worker index into :attr:`workers`), ``src`` (index into
            :class:`PhaseTimes`; Int32, Int64 from 2^31 rows on), ``layout`` (null: no
            phases), rank, stage, worker, iter, ts, dur, cpu, tokens, samples,
            mem_allocated, mem_reserved, mem_alloc_retries, mem_device_allocs.
            ``stage`` and ``worker`` are Categorical (memory at scale;
            :attr:`workers`, :attr:`left_out` and the public frames of
            ``analyze.frames`` hold them as String).
        workers: one row per worker: wid, stage, rank, worker.
        phase_names: the run's distinct phase names (sorted).
        layouts: the run's layouts by id.
        times: the phase times (:class:`PhaseTimes`).
        queues: queue depth samples: rank, stage, worker, name, ts, depth, capacity.
        events: rank, stage, worker, name, ts, dur.
        notes: things the loader had to work around, for the report.
        hosts: host name of each worker (by ``wid``; None when unknown: the
            ``workers`` table has no row or no host for it).
        left_out: ``rank, stage, worker, iter`` of the iterations left out of
            :attr:`iterations` because a value is impossible (:func:`impossible_rows`);
            usually empty.
        system: the run's system samples and machine rows
            (:class:`tlog.analyze.system.SystemData`; empty frames without them).
    """

    run_id: str
    run: dict[str, Any]
    iterations: pl.DataFrame
    workers: pl.DataFrame
    phase_names: list[str]
    layouts: dict[int, Layout]
    times: PhaseTimes
    queues: pl.DataFrame
    events: pl.DataFrame
    notes: list[str] = field(default_factory=list)
    hosts: dict[int, str | None] = field(default_factory=dict)
    left_out: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(
        schema={"rank": pl.Int32, "stage": pl.String, "worker": pl.String, "iter": pl.Int64}))
    system: SystemData = field(default_factory=SystemData)
    #: averaged timer logs' logged intervals: by worker name, each interval's
    #: last iteration (``tlog.ingest.timer_logs.stored_intervals``; {} for other runs)
    intervals: dict[str, list[int]] = field(default_factory=dict)
    _device_times: bool | None = field(default=None, repr=False)
    _gpu_reader: _DeviceTimes | None = field(default=None, repr=False)

    def fill_device_times(self, pos: int) -> None:
        """Make sure ``times.gpu`` and ``times.gpu_valid`` hold every device time
        at a flat position below ``pos``: a run loaded for attribution
        (``load_run(..., lazy_device_times=True)``) reads them only as the walk
        reaches them (memory at scale). Nothing to do otherwise.

        Raises:
            DatabaseError: the run's rows changed since they were loaded.
        """
        if self._gpu_reader is not None:
            self._gpu_reader.fill(pos)

    def close_device_times(self) -> None:
        """Stop the lazy read of device times (:meth:`fill_device_times`) and
        restore DuckDB's memory limit; what was not read stays 0."""
        if self._gpu_reader is not None:
            self._gpu_reader.close()
            self._gpu_reader = None

    @property
    def device_times(self) -> bool:
        """Whether any phase of the run has a device time (also after
        :meth:`release_device_times`)."""
        if self._device_times is None:
            return bool(self.times.gpu_valid.any())
        return self._device_times

    def release_device_times_before(self, pos: int) -> None:
        """Return to the operating system the memory of the device times at flat
        positions below ``pos`` (``times.gpu`` and ``times.gpu_valid``, whole
        pages only), while attribution still walks the later ones (memory at
        scale: they and the attribution's output need not be held
        together). The caller reads none of those positions afterwards: they
        then read as 0 and False. Nothing happens for arrays the loader did
        not map (:func:`releasable`) or where the system lacks
        ``MADV_DONTNEED``. :attr:`device_times` keeps its answer."""
        if self._device_times is None:
            self._device_times = bool(self.times.gpu_valid.any())
        for arr in (self.times.gpu, self.times.gpu_valid):
            _release_front(arr, pos)

    def release_host_times_before(self, pos: int) -> None:
        """As :meth:`release_device_times_before` for the host times
        (``times.host``): their pages below flat position ``pos`` go back to the
        system while attribution walks the later ones (memory at scale:
        ``diagnose`` locates the lockstep, the only other reader of host
        times, before the walk). Released values read as 0."""
        _release_front(self.times.host, pos)

    def release_host_times(self) -> None:
        """Free the per-phase host times once nothing reads them any more (after
        attribution and the lockstep test): about 490 MiB at 10M iterations.
        Afterwards ``times.host`` is empty and every
        ``times.length`` 0."""
        t = self.times
        self.times = PhaseTimes(host=np.empty(0),
                                host_start=np.broadcast_to(t.host_start.dtype.type(0),
                                                           t.host_start.shape),
                                length=np.broadcast_to(np.int32(0), t.length.shape),
                                gpu=t.gpu, gpu_valid=t.gpu_valid, gpu_start=t.gpu_start)

    def release_device_times(self) -> None:
        """Free the per-phase device times once nothing reads them any more
        (after attribution; the lockstep test reads host times only): about
        625 MiB at 10M iterations. Afterwards ``times.gpu`` and
        ``times.gpu_valid`` are empty and every ``times.gpu_start`` is -1;
        :attr:`device_times` keeps its answer."""
        t = self.times
        if self._device_times is None:
            self._device_times = bool(t.gpu_valid.any())
        self.times = PhaseTimes(host=t.host, host_start=t.host_start, length=t.length,
                                gpu=np.empty(0), gpu_valid=np.empty(0, dtype=bool),
                                gpu_start=np.broadcast_to(np.int64(-1), t.gpu_start.shape))


def releasable(n: int, dtype: type) -> np.ndarray:
    """An uninitialised array of ``n`` values of ``dtype`` in its own anonymous
    memory map, so that :meth:`RunData.release_device_times_before` can hand
    its front pages back to the system before the array is freed (numpy's own
    allocation cannot be returned in parts). The map is unmapped with the
    array."""
    nbytes = n * np.dtype(dtype).itemsize
    if nbytes == 0:
        return np.empty(n, dtype=dtype)
    private = getattr(mmap, "MAP_PRIVATE", None)
    if private is None:  # no private maps (Windows): a plain array, never released early
        return np.empty(n, dtype=dtype)
    # Private: MADV_DONTNEED frees its pages (a shared map would keep them).
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=private | mmap.MAP_ANONYMOUS),
                         dtype=dtype, count=n)


def _release_front(arr: np.ndarray, pos: int) -> None:
    """``madvise(MADV_DONTNEED)`` the whole pages of ``arr[:pos]`` when ``arr``
    is a :func:`releasable` array (else nothing)."""
    base = arr.base
    if isinstance(base, memoryview):
        base = base.obj
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if not isinstance(base, mmap.mmap) or advice is None or pos <= 0:
        return
    nbytes = min(pos, len(arr)) * arr.itemsize
    whole = nbytes - nbytes % mmap.PAGESIZE
    if whole > 0:
        base.madvise(advice, 0, whole)


_RUN_COLUMNS = ("run_id", "name", "source", "root", "started", "world_size", "tags", "config",
                "phase_kinds")
_SCALARS = ("rank", "stage", "worker", "iter", "ts", "dur", "cpu", "tokens", "samples",
            "mem_allocated", "mem_reserved", "mem_alloc_retries", "mem_device_allocs", "layout")
_ITER_SQL = (f"SELECT {', '.join(_SCALARS)}, hash(stage, rank, worker) AS wk, "
             "phase_host_s, len(phase_gpu_s) AS gpu_len, "
             # An impossible device time (:func:`impossible_rows`): DuckDB orders NaN
             # above every number, so list_max catches NaN and +inf, list_min -inf.
             f"coalesce(list_min(phase_gpu_s) < 0 OR list_max(phase_gpu_s) > {MAX_DURATION_S!r},"
             " false) AS gpu_bad "
             "FROM iterations WHERE {rows}")
#: The second read (:class:`_DeviceTimes`): the device lists alone, in the same order.
_GPU_SQL = "SELECT phase_gpu_s FROM iterations WHERE {rows}"
#: Sizes of the flat phase-time arrays, read first so that they are allocated once.
_SIZE_SQL = ("SELECT count(*), coalesce(sum(len(phase_host_s)), 0), "
             "coalesce(sum(len(phase_gpu_s)), 0), coalesce(sum(list_count(phase_gpu_s)), 0) "
             "FROM iterations WHERE {rows}")
#: Rows per Arrow record batch when the iterations are streamed from DuckDB: the
#: phase lists of one batch are copied into the flat arrays and dropped, so the
#: run is never held twice (docs: "Bounded memory at scale"). Tests set it
#: small to check that streaming changes nothing.
BATCH_ROWS = 1 << 17


def _rows(sql: str, since: float | None, *, spans: bool = False) -> str:
    """``sql`` with its ``{rows}`` placeholder as the choice of a run's rows:
    ``run_id = $run``, and with ``since`` (a window, :func:`load_run`) only
    the rows at or after it (``ts >= $since``; ``spans``: the rows ending at
    or after it, ``ts + dur``, for events)."""
    if since is None:
        return sql.format(rows="run_id = $run")
    end = "ts + coalesce(dur, 0)" if spans else "ts"
    return sql.format(rows=f"run_id = $run AND {end} >= $since")


def _params(run_id: str, since: float | None) -> dict[str, Any]:
    return {"run": run_id} if since is None else {"run": run_id, "since": since}


def _frame(con: duckdb.DuckDBPyConnection, sql: str, run_id: str,
           since: float | None = None) -> pl.DataFrame:
    return pl.from_arrow(con.sql(sql, params=_params(run_id, since)).to_arrow_table())


def _run_row(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    cols = ", ".join(_RUN_COLUMNS)
    rows = con.sql(f"SELECT {cols} FROM runs WHERE run_id = $run",
                   params={"run": run_id}).fetchall()
    if not rows:
        msg = f"no run {run_id!r} in the database: 'tlog runs' lists the run ids"
        raise RunNotFoundError(msg)
    return _run_dict(rows[0])


def _run_dict(row: tuple) -> dict[str, Any]:
    """A ``runs`` row (:data:`_RUN_COLUMNS`) as :attr:`RunData.run`, JSON read."""
    out = dict(zip(_RUN_COLUMNS, row, strict=True))
    for key in ("tags", "config", "phase_kinds"):
        value = out.get(key)
        if isinstance(value, str):
            try:
                out[key] = json.loads(value)
            except ValueError:
                out[key] = None
    return out


def _check_schema(con: duckdb.DuckDBPyConnection) -> None:
    # a statement that reads the column, not a catalog query (a third of the cost)
    try:
        con.execute("SELECT phase_host_s FROM iterations LIMIT 0").fetchall()
    except duckdb.BinderException:
        msg = ("the database has an older schema (phases as a table): open it once for "
               "writing ('tlog ingest RUN_DIR --db PATH') to migrate it")
        raise DatabaseError(msg)


def _doubles(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """float64 numpy view of an Arrow double array (nulls as 0) and its validity,
    read from the Arrow buffers (no per-value conversion)."""
    values = values.cast(pa.float64()) if values.type != pa.float64() else values
    n, off = len(values), values.offset
    bufs = values.buffers()
    data = np.frombuffer(bufs[1], dtype=np.float64, count=off + n)[off:]
    if values.null_count == 0 or bufs[0] is None:
        return data, np.ones(n, dtype=bool)
    bits = np.frombuffer(bufs[0], dtype=np.uint8)
    valid = np.unpackbits(bits, count=off + n, bitorder="little")[off:].astype(bool)
    return np.where(valid, data, 0.0), valid


def _bad_values(values: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """Positions of ``values`` outside ``[0, MAX_DURATION_S]`` or not finite
    (NaN fails both comparisons), among the valid ones."""
    ok = values >= 0.0
    ok &= values <= MAX_DURATION_S
    if valid is not None:
        ok |= ~valid
    return np.flatnonzero(~ok)


def _rows_of(positions: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Source rows whose list (``start``, ``length``) holds the flat ``positions``."""
    if len(positions) == 0:
        return np.empty(0, dtype=np.int64)
    rows = np.flatnonzero(length > 0)
    order = np.argsort(start[rows], kind="stable")
    rows = rows[order]
    at = np.searchsorted(start[rows], positions, side="right") - 1
    return np.unique(rows[at])


def impossible_rows(scalars: pl.DataFrame, host: np.ndarray, host_start: np.ndarray,
                    length: np.ndarray, gpu: np.ndarray, gpu_valid: np.ndarray,
                    gpu_start: np.ndarray) -> np.ndarray:
    """Source rows (int64, ascending) holding a value no measurement can have.

    A row is impossible when its ``dur``, a phase's host or device time is
    negative, not finite (NaN, infinity) or longer than
    ``ingest.manifest.MAX_DURATION_S`` (a day), or its ``ts`` or ``cpu`` is not
    finite. Ingest rejects such lines (``bad_duration``); an
    older database may hold them, and one phase of 1e308 s made every sum
    overflow to infinity and ``diagnose`` fail. Leaving the row out is what
    a fresh ingest does (it rejects the line), and with every value at most a
    day no sum over a run can overflow a float64.

    Args:
        scalars: the iteration columns (``ts``, ``dur``, ``cpu``), one row per source row.
        host, host_start, length, gpu, gpu_valid, gpu_start: the phase lists,
            flat (seconds; :class:`PhaseTimes`).
    """
    rows = [_bad_scalar_rows(scalars), _rows_of(_bad_values(host, None), host_start, length)]
    if len(gpu):
        rows.append(_rows_of(_bad_values(gpu, gpu_valid), gpu_start, length))
    return np.unique(np.concatenate(rows)).astype(np.int64)


def _bad_scalar_rows(scalars: pl.DataFrame) -> np.ndarray:
    """Rows of ``scalars`` whose ``dur`` is impossible or ``ts``/``cpu`` not finite
    (:func:`impossible_rows`)."""
    ts = scalars["ts"].to_numpy()
    dur = scalars["dur"].to_numpy()
    cpu = scalars["cpu"].fill_null(0.0).to_numpy()
    bad = ~((dur >= 0.0) & (dur <= MAX_DURATION_S) & np.isfinite(ts) & np.isfinite(cpu))
    return np.flatnonzero(bad)


def _primitive(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """numpy view of a fixed-width Arrow array's values (undefined where null)
    and its validity (None without nulls)."""
    n, off = len(arr), arr.offset
    bufs = arr.buffers()
    dtype = arr.type.to_pandas_dtype()
    data = np.frombuffer(bufs[1], dtype=dtype, count=off + n)[off:]
    if arr.null_count == 0 or bufs[0] is None:
        return data, None
    bits = np.frombuffer(bufs[0], dtype=np.uint8)
    return data, np.unpackbits(bits, count=off + n, bitorder="little")[off:].astype(bool)


def _fill_lists(column: pa.Array, out: np.ndarray, valid_out: np.ndarray | None, base: int
                ) -> tuple[np.ndarray, np.ndarray, int]:
    """Copy an Arrow list array's values into ``out[base:]`` (nulls as 0; their
    validity into ``valid_out`` when given). Returns the start of each list in
    ``out`` (-1 for a null list), its length (0 for a null list) and the number
    of values copied."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = arr.offsets.to_numpy().astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    start = offsets[:-1] - first + base
    length = np.diff(offsets)
    if arr.null_count:
        null_list = ~arr.is_valid().to_numpy(zero_copy_only=False)
        start[null_list] = -1
        length[null_list] = 0
    if last > first:
        flat, valid = _doubles(arr.values.slice(first, last - first))
        out[base:base + len(flat)] = flat
        if valid_out is not None:
            valid_out[base:base + len(flat)] = valid
    return start, length, last - first


#: DuckDB's memory limit while the iterations are streamed. DuckDB keeps the
#: blocks it read in its buffer pool up to its limit (80% of RAM by default):
#: 1.1 GiB after a scan of 10M iterations, memory diagnose never reads again.
#: Source: tlog's choice, measured (benchmarks.bench_diagnose): the scan runs as
#: fast with it.
SCAN_MEMORY_LIMIT = "256MiB"
#: DuckDB's memory limit while the device lists are read the second time
#: (:class:`_DeviceTimes`, one list column, interleaved with the walk, so its
#: buffers add to the attribution's memory). Source: tlog's choice, measured
#: (benchmarks.bench_diagnose at 10M iterations).
DEVICE_SCAN_MEMORY_LIMIT = "64MiB"
#: DuckDB's memory limit set for a moment after the scan to evict the cached
#: blocks (:func:`_flush_cache`). Source: tlog's choice (any value under what the
#: pool holds; DuckDB rejects 0).
FLUSH_MEMORY_LIMIT = "1MiB"


#: Fewest iterations for which the scan bounds DuckDB's cache (:func:`_bound_cache`):
#: a smaller run's blocks are a few MiB, and setting, flushing and restoring the
#: limit cost a small run's diagnosis four statements. Source: tlog's choice.
BOUND_CACHE_FROM_ROWS = 100_000


def _bound_cache(con: duckdb.DuckDBPyConnection, bound: str = SCAN_MEMORY_LIMIT) -> str | None:
    """Lower DuckDB's memory limit to ``bound`` for a scan (it applies to the
    whole database, so the caller restores the returned value, the limit
    before); None when it cannot be set, or must not be: in a database shared
    by threads (:func:`tlog.ingest.db.sharing_database`)."""
    from tlog.ingest.db import memory_limit_is_shared

    if memory_limit_is_shared():
        return None
    try:
        limit = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
        con.execute(f"SET memory_limit = '{bound}'")
    except duckdb.Error:
        return None
    return str(limit)


def _index_type(n: int) -> type:
    """int32 for positions in a flat array of ``n`` values when they fit, else int64."""
    return np.int32 if n < np.iinfo(np.int32).max else np.int64


def _flush_cache(con: duckdb.DuckDBPyConnection) -> None:
    """Empty DuckDB's buffer pool after the scan: the blocks it keeps up to
    :data:`SCAN_MEMORY_LIMIT` (about 250 MiB after 10M iterations) are never read
    again by diagnose; lowering the limit to :data:`FLUSH_MEMORY_LIMIT` evicts
    them (the caller restores the limit). Nothing happens if DuckDB refuses."""
    try:
        con.execute(f"SET memory_limit = '{FLUSH_MEMORY_LIMIT}'")
    except duckdb.Error:
        pass


def _stream(con: duckdb.DuckDBPyConnection, run_id: str, since: float | None = None
            ) -> tuple[pl.DataFrame, PhaseTimes, np.ndarray]:
    """Read the run's iterations in Arrow record batches of :data:`BATCH_ROWS`.

    The phase lists of each batch are copied into flat arrays allocated once
    (their sizes are read first, in the same transaction) and the batch is
    dropped; the scalar columns are kept as Arrow chunks and turned into the
    polars frame one column at a time. Peak memory is then about the final
    arrays plus one batch and one column, instead of the whole
    Arrow result next to its copies.

    The device times are not read here (only where each list starts, and
    whether it holds an impossible value): ``times.gpu`` and
    ``times.gpu_valid`` are allocated unwritten, for :class:`_DeviceTimes`.

    Returns:
        ``(scalars, times, bad, has_gpu)``: the scalar columns (``_SCALARS``
        and ``wk``) in query order, the phase times (:class:`PhaseTimes`), the
        rows (ascending) whose phase times are impossible
        (:func:`impossible_rows`), and whether any device time was measured.
    """
    limit = None
    con.execute("BEGIN TRANSACTION")  # one snapshot for the sizes and the rows
    try:
        n_rows, n_host, n_gpu, n_valid = con.execute(_rows(_SIZE_SQL, since),
                                                   _params(run_id, since)).fetchall()[0]
        if n_rows >= BOUND_CACHE_FROM_ROWS:
            limit = _bound_cache(con)
        # Phase times in their own memory maps: attribution frees them as it
        # walks (RunData.release_device_times_before).
        host = releasable(n_host, np.float64)
        gpu = releasable(n_gpu, np.float64)
        gpu_valid = releasable(n_gpu, np.bool_)
        # int32 where the positions fit (114 MiB less at 10M iterations).
        host_start = np.empty(n_rows, dtype=_index_type(n_host))
        length = np.empty(n_rows, dtype=np.int32)
        gpu_start = np.empty(n_rows, dtype=_index_type(n_gpu))
        numeric = [c for c in (*_SCALARS, "wk") if c not in ("stage", "worker")]
        values: dict[str, np.ndarray] = {}
        valids: dict[str, np.ndarray] = {}
        heads: list[tuple[int, str, str]] = []   # (row, stage, worker) where a worker's rows begin
        bad: list[np.ndarray] = []
        row = hb = gb = 0
        prev_wk = None
        reader = con.sql(_rows(_ITER_SQL, since),
                         params=_params(run_id, since)).to_arrow_reader(BATCH_ROWS)
        schema = reader.schema
        for name in numeric:
            values[name] = np.empty(n_rows, dtype=schema.field(name).type.to_pandas_dtype())
        for batch in reader:
            m = batch.num_rows
            if m == 0:
                continue
            hs, hl, used_h = _fill_lists(batch.column("phase_host_s"), host, None, hb)
            # Device lists: only where each starts here; their values are read
            # by the second read (_DeviceTimes) as attribution walks them.
            gs, used_g = _list_starts(batch.column("gpu_len"), gb)
            host_start[row:row + m], length[row:row + m], gpu_start[row:row + m] = hs, hl, gs
            # Impossible values of this batch, found before the next one is read.
            hbad = _rows_of(_bad_values(host[hb:hb + used_h], None) + hb, hs, hl)
            gbad = np.flatnonzero(batch.column("gpu_bad").to_numpy(zero_copy_only=False))
            for rows in (hbad, gbad):
                if len(rows):
                    bad.append(rows + row)
            # Scalars are copied out of the batch (an imported Arrow batch stays in
            # memory as long as any of its columns does).
            for name in numeric:
                arr = batch.column(name)
                arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
                data, valid = _primitive(arr)
                if valid is None or valid.any():   # all null: leave the pages untouched
                    values[name][row:row + m] = data
                if valid is not None:
                    if name not in valids:
                        valids[name] = np.ones(n_rows, dtype=bool)
                    valids[name][row:row + m] = valid
            # The strings of each run of one worker's rows (``wk``, DuckDB's hash
            # of stage, rank and worker), not of every row.
            wk = values["wk"][row:row + m]
            change = np.ones(m, dtype=bool)
            np.not_equal(wk[1:], wk[:-1], out=change[1:])
            if prev_wk is not None and wk[0] == prev_wk:
                change[0] = False
            at = np.flatnonzero(change)
            if len(at):
                idx = pa.array(at)
                heads += zip((at + row).tolist(), batch.column("stage").take(idx).to_pylist(),
                             batch.column("worker").take(idx).to_pylist(), strict=True)
            prev_wk = wk[-1]
            row, hb, gb = row + m, hb + used_h, gb + used_g
            del batch
        del reader
    finally:
        con.execute("ROLLBACK")
        if limit is not None:
            _flush_cache(con)
            con.execute(f"SET memory_limit = '{limit}'")
    run_of = np.repeat(np.arange(len(heads)),
                       np.diff(np.append([h[0] for h in heads], row)).astype(np.int64))
    series = []
    for name in (*_SCALARS, "wk"):
        if name in ("stage", "worker"):
            k = 1 if name == "stage" else 2
            # Categorical: 4 bytes a row instead of a 16-byte string view (230 MiB
            # less for the two at 10M iterations).
            col = pl.Series(name, [h[k] for h in heads], dtype=pl.Categorical)
            series.append(col.gather(run_of) if len(run_of) else col.clear())
            continue
        typ = schema.field(name).type
        data = values.pop(name)[:row]
        valid = valids.pop(name, None)
        if valid is not None and not valid.any():  # never recorded (mem_* without a GPU)
            # polars' all-null column holds no pages (``pa.nulls`` writes n x 8 zero
            # bytes: 77 MiB per column at 10M iterations).
            series.append(pl.Series(name, pa.nulls(0, type=typ)).extend_constant(None, row))
            continue
        bitmap = None if valid is None else pa.py_buffer(np.packbits(valid[:row],
                                                                      bitorder="little"))
        series.append(pl.Series(name, pa.Array.from_buffers(typ, row,
                                                            [bitmap, pa.py_buffer(data)])))
    scalars = pl.DataFrame(series)
    times = PhaseTimes(host=host, host_start=host_start, length=length, gpu=gpu,
                       gpu_valid=gpu_valid, gpu_start=gpu_start)
    return (scalars, times, (np.concatenate(bad) if bad else np.empty(0, dtype=np.int64)),
            n_valid > 0)


def _list_starts(lengths: pa.Array, base: int) -> tuple[np.ndarray, int]:
    """Where each list of a batch starts in the flat array (from ``base``; -1 for a
    null list) given the lists' lengths (null for a null list), and the number
    of values the batch's lists hold: what :func:`_fill_lists` returns as
    starts, without the values."""
    arr = lengths.combine_chunks() if isinstance(lengths, pa.ChunkedArray) else lengths
    n = arr.fill_null(0).to_numpy().astype(np.int64)
    start = np.empty(len(n), dtype=np.int64)
    if len(n):
        start[0] = base
        np.cumsum(n[:-1], out=start[1:])
        start[1:] += base
    if arr.null_count:
        start[~arr.is_valid().to_numpy(zero_copy_only=False)] = -1
    return start, int(n.sum())


_CHANGED = ("the run's iterations changed while they were read (another connection "
            "wrote to it): run the command again")


class _DeviceTimes:
    """The second read of a run's device-time lists (``phase_gpu_s``), into the
    flat arrays ``times.gpu`` / ``times.gpu_valid`` that the first read sized and
    placed (``times.gpu_start``), batch by batch as far as attribution asks
    (:meth:`fill`): with the walk freeing what it passed
    (:meth:`RunData.release_device_times_before`), the run's device times are
    never held whole when the walk reads them in order (memory at scale).
    Reads through its own cursor, with DuckDB's memory limit lowered as in
    the first read; :meth:`close` restores it.

    Raises (from :meth:`fill`):
        DatabaseError: the run's rows changed between the two reads.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str, times: PhaseTimes,
                 since: float | None = None) -> None:
        self._times = times
        self._cur = con.cursor()
        self._limit = _bound_cache(self._cur, DEVICE_SCAN_MEMORY_LIMIT)
        self._reader = self._cur.sql(_rows(_GPU_SQL, since), params=_params(
            run_id, since)).to_arrow_reader(BATCH_ROWS)
        self._row = 0
        #: Flat positions below this one are written.
        self.filled = 0

    def fill(self, pos: int) -> None:
        """Read batches until every device time at a flat position below ``pos``
        is written (all of them for ``pos >= len(times.gpu)``)."""
        t = self._times
        pos = min(pos, len(t.gpu))
        while self.filled < pos and self._reader is not None:
            try:
                batch = self._reader.read_next_batch()
            except StopIteration:
                self.close()
                break
            m = batch.num_rows
            if m == 0:
                continue
            lists = batch.column(0)
            lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
            gs, used = _list_starts(pc.list_value_length(lists), self.filled)
            if self._row + m > len(t.gpu_start) or \
                    not np.array_equal(gs, t.gpu_start[self._row:self._row + m]):
                self.close()
                raise DatabaseError(_CHANGED)
            _fill_lists(lists, t.gpu, t.gpu_valid, self.filled)
            self._row += m
            self.filled += used
        if self.filled < pos:
            raise DatabaseError(_CHANGED)

    def close(self) -> None:
        """Stop reading (what was not read stays 0) and restore DuckDB's memory limit."""
        if self._reader is None:
            return
        self._reader = None
        try:
            if self._limit is not None:
                _flush_cache(self._cur)
                self._cur.execute(f"SET memory_limit = '{self._limit}'")
        finally:
            self._cur.close()


def _order(it: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Number the workers and put the iterations in analysis order.

    Workers get ``wid`` in (stage, rank, worker) order. The iterations must be
    grouped by worker and in ``iter`` order within; ingest writes them that
    way (file by file, line by line), and then the frame is left as it is
    (no sort: the workers' blocks stay in file order). Otherwise it is sorted
    by (wid, iter). ``src`` keeps each row's position in the query result.
    """
    # Index columns from numpy (polars keeps freed memory for a while: at 10M
    # iterations a UInt32 row index cast to Int64 left 120 MiB behind).
    # int32 while the rows fit.
    src_type = _index_type(it.height)
    if "src" not in it.columns:
        it.insert_column(0, pl.Series("src", np.arange(it.height, dtype=src_type)))
    else:
        it = it.with_columns(pl.col("src").cast(pl.Int32 if src_type is np.int32 else pl.Int64))
    n = it.height
    keys = ("stage", "rank", "worker")
    # Runs of equal (stage, rank, worker), found on DuckDB's 64-bit hash of the
    # three (``wk``) instead of comparing strings row by row.
    wk = it["wk"].to_numpy()
    change = np.ones(n, dtype=bool)
    np.not_equal(wk[1:], wk[:-1], out=change[1:])
    it = it.drop("wk")
    run_starts = np.flatnonzero(change)
    heads = it[run_starts].select(keys).with_columns(pl.col("stage", "worker").cast(pl.String))
    workers = (heads.unique().sort(list(keys)).with_row_index("wid")
               .with_columns(pl.col("wid").cast(pl.Int32)))
    run_wid = heads.join(workers, on=list(keys), how="left", maintain_order="left")["wid"]
    wid = np.repeat(run_wid.to_numpy(), np.diff(np.append(run_starts, n)))
    it = it.with_columns(wid=pl.Series(wid, dtype=pl.Int32))
    iters = it["iter"].to_numpy()
    in_order = len(run_starts) == workers.height and bool(
        (np.diff(iters)[~change[1:]] > 0).all())
    if not in_order:
        it = it.sort(["wid", "iter"])
    return it, workers


def _system(con: duckdb.DuckDBPyConnection, run_id: str, since: float | None,
            group: _GroupReads | None) -> SystemData:
    """:func:`load_system`, or for a run of ``group`` holding neither system
    samples nor machine rows, the empty frames of that read (made once)."""
    if group is None or run_id in group.held["sys_samples"] or run_id in group.held["machines"]:
        return load_system(con, run_id, since)
    empty = group.empty("system", lambda: load_system(con, run_id, since))
    return SystemData(samples=empty.samples.clear(), machines=empty.machines.clear())


def _layouts(con: duckdb.DuckDBPyConnection, run_id: str, group: _GroupReads | None = None
             ) -> tuple[list[str], dict[int, Layout]]:
    lay = (_frame(con, _LAYOUTS_SQL.format(rows="run_id = $run"), run_id) if group is None
           else group.layouts_of(run_id))
    phases = lay["phase"].to_list()
    names = sorted(set(phases))
    index = {n: i for i, n in enumerate(names)}
    # All layouts at once (a run whose phase names carry a step number has one
    # layout per iteration): flat arrays, then one slice per layout.
    pid = np.array([index[p] for p in phases], dtype=np.int32)
    cat = np.array([CAT_CODE.get(c, CAT_CODE["compute"]) for c in lay["category"].to_list()],
                   dtype=np.int8)
    top = lay.select(pl.col("parent").is_null() & ~pl.col("phase").str.contains("/",
                                                                              literal=True)
                     ).to_series().to_numpy().astype(bool)
    parents = lay["parent"].to_list()
    ids = lay["layout"].to_numpy()
    starts = np.flatnonzero(np.diff(ids)) + 1 if len(ids) else np.empty(0, dtype=np.int64)
    edges = [0, *starts.tolist(), len(ids)]
    out: dict[int, Layout] = {}
    for a, b in itertools.pairwise(edges):
        if b > a:
            out[int(ids[a])] = Layout(layout=int(ids[a]), pid=pid[a:b], cat=cat[a:b],
                                      top=top[a:b], parent=parents[a:b])
    return names, out


#: Reads of the runs' small tables of :func:`_load` (without a window).
_LAYOUTS_SQL = ("SELECT layout, seq, phase, parent, category FROM phase_layouts "
                "WHERE {rows} ORDER BY layout, seq")
_SOURCES_SQL = ("SELECT source, bool_or(json_extract(meta, '$.extra.records_dropped') IS NOT NULL) "
                "FROM files WHERE {rows} GROUP BY source")
_QUEUES_SQL = ("SELECT rank, stage, worker, name, ts, depth, capacity "
               "FROM queue_samples WHERE {rows} ORDER BY name, ts")
_EVENTS_SQL = "SELECT rank, stage, worker, name, ts, dur FROM events WHERE {rows} ORDER BY ts"
_HOSTS_SQL = ("SELECT stage, rank, worker, any_value(host) AS host FROM workers "
              "WHERE {rows} GROUP BY stage, rank, worker")


class _GroupReads:
    """What :func:`_load` reads of each of a group of runs from the small
    tables, read for the whole group in one statement per table: the ``runs``
    rows, phase layouts, file sources and worker hosts (each run's part
    exactly its own read: the same columns, and its rows in the same order
    where that order is total), and which runs hold any queue sample, event,
    system sample or machine row (a run holding none gets the empty frames of
    its own read, made once). A run holding some of those is read alone, as
    ever: their order has ties (samples of one ``ts``). See :func:`group_reads`."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> None:
        self.con = con
        ids = {"ids": sorted(set(run_ids))}
        where = "run_id IN (SELECT unnest($ids::VARCHAR[]))"
        cols = ", ".join(_RUN_COLUMNS)
        self.runs = {row[0]: row for row in con.execute(
            f"SELECT {cols} FROM runs WHERE {where}", ids).fetchall()}
        _check_schema(con)

        def parts(sql: str) -> tuple[dict[Any, pl.DataFrame], pl.DataFrame]:
            body = (sql.format(rows=where).replace("SELECT ", "SELECT run_id AS _run, ", 1)
                    .replace(" ORDER BY ", " ORDER BY _run, ", 1)
                    .replace(" GROUP BY ", " GROUP BY _run, ", 1))
            frame = pl.from_arrow(con.sql(body, params=ids).to_arrow_table())
            empty = frame.clear().drop("_run")
            return ({k[0]: v.drop("_run") for k, v in frame.partition_by(
                "_run", as_dict=True, maintain_order=True).items()}, empty)

        self.layouts, self._no_layouts = parts(_LAYOUTS_SQL)
        self.hosts, self._no_hosts = parts(_HOSTS_SQL)
        self.sources: dict[str, dict[str, bool]] = {}
        for run, source, dropped in con.execute(
                _SOURCES_SQL.format(rows=where).replace("SELECT ", "SELECT run_id, ", 1)
                .replace(" GROUP BY ", " GROUP BY run_id, ", 1), ids).fetchall():
            self.sources.setdefault(run, {})[source] = dropped
        held: dict[str, set[str]] = {t: set() for t in ("queue_samples", "events",
                                                         "sys_samples", "machines")}
        for table, run in con.execute(" UNION ALL ".join(
                f"SELECT DISTINCT '{t}', run_id FROM {t} WHERE {where}" for t in held),
                ids).fetchall():
            held[table].add(run)
        self.held = held
        self._empty: dict[str, Any] = {}

    def covers(self, con: duckdb.DuckDBPyConnection, run_id: str) -> bool:
        """Whether this group read ``run_id`` on ``con`` (else read it alone)."""
        return con is self.con and run_id in self.runs

    def empty(self, key: str, read: Any) -> Any:
        """The empty result of one run's read ``key`` (``read()`` once, for a
        run of the group that holds none)."""
        if key not in self._empty:
            self._empty[key] = read()
        return self._empty[key]

    def layouts_of(self, run_id: str) -> pl.DataFrame:
        return self.layouts.get(run_id, self._no_layouts)

    def hosts_of(self, run_id: str) -> pl.DataFrame:
        return self.hosts.get(run_id, self._no_hosts)


#: The group whose reads :func:`load_run` takes (:func:`group_reads`), in
#: this thread or task.
_GROUP: ContextVar[_GroupReads | None] = ContextVar("tlog_group_reads", default=None)


@contextmanager
def group_reads(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> Iterator[None]:
    """Within the block, :func:`load_run` of a run of ``run_ids`` on ``con``
    (without a window) takes its small tables from reads of the whole group
    (one statement per table instead of one per run and table; a few ms of a
    small run's diagnosis): the :class:`RunData` is the one it reads alone.
    ``tlog ingest`` of many runs diagnoses them a group at a time so.

    A database these reads fail on (one from before a table) is read run by
    run, as without the block.
    """
    try:
        group = _GroupReads(con, run_ids)
    except duckdb.Error:
        group = None
    token = _GROUP.set(group)
    try:
        yield
    finally:
        _GROUP.reset(token)


def load_run(con: duckdb.DuckDBPyConnection, run_id: str, *,
             lazy_device_times: bool = False, since: float | None = None) -> RunData:
    """Read one run's tables into a :class:`RunData`.

    Reads through its own cursor (``con.cursor()``), so a result the caller
    left unfinished on ``con`` does not get in the way (DuckDB 2 refuses new
    work on such a connection).

    Args:
        con: an open tlog database (``ingest.db.connect``); read-only is enough.
        run_id: the run to load.
        lazy_device_times: leave the per-phase device times unread: a second
            read of the lists fills ``times.gpu`` as far as
            :meth:`RunData.fill_device_times` asks (attribution asks chunk by
            chunk; memory at scale); the caller ends it with
            :meth:`RunData.close_device_times`. Default: read them all here.
        since: a window (epoch seconds; ``tlog watch``): only the iterations,
            queue samples and system samples whose ``ts`` is at or after it,
            and the events ending at or after it; a note says so. Default:
            the whole run.

    Raises:
        RunNotFoundError: no such run, or it holds no iterations (in the window).
        DatabaseError: the database predates schema v2 and was opened
            read-only, or the run's rows changed between the two reads of
            the phase lists.
    """
    group = _GROUP.get()
    if group is None or since is not None or not group.covers(con, run_id):
        group = None
    cur = con.cursor()
    try:
        data = _load(cur, run_id, since, group)
    finally:
        cur.close()
    if len(data.times.gpu):
        data._gpu_reader = _DeviceTimes(con, run_id, data.times, since)
        if not lazy_device_times:
            try:
                data.fill_device_times(len(data.times.gpu))
            finally:
                data.close_device_times()
    return data


def _load(con: duckdb.DuckDBPyConnection, run_id: str, since: float | None = None,
          group: _GroupReads | None = None) -> RunData:
    if group is None:
        run = _run_row(con, run_id)
        _check_schema(con)
    else:
        run = _run_dict(group.runs[run_id])
    scalars, times, bad_lists, has_gpu = _stream(con, run_id, since)
    if scalars.height == 0 and since is not None:
        msg = (f"run {run_id!r} holds no iterations starting at or after {since:.3f} "
               f"(epoch s): widen the window")
        raise RunNotFoundError(msg)
    if scalars.height == 0:
        rejected = con.execute("SELECT count(*) FROM rejects WHERE run_id = ?",
                               [run_id]).fetchall()[0][0]
        if rejected:
            literal = run_id.replace("'", "''")
            msg = (f"run {run_id!r} holds no iterations: all {rejected} of its lines that were "
                   f"read were rejected; see why with: tlog sql \"SELECT file, line, reason "
                   f"FROM rejects WHERE run_id = '{literal}' LIMIT 20\"")
        else:
            msg = (f"run {run_id!r} holds no iterations: ingest its log files "
                   f"('tlog ingest RUN_DIR') before diagnosing it")
        raise RunNotFoundError(msg)
    length = times.length
    notes: list[str] = []
    if since is not None:
        notes.append(f"a window of the run: only the iterations starting at or after "
                     f"{since:.3f} (epoch s)")
    bad = np.union1d(_bad_scalar_rows(scalars), bad_lists).astype(np.int64)
    strings = pl.col("stage", "worker").cast(pl.String)
    left_out = scalars.select("rank", "stage", "worker", "iter").clear().with_columns(strings)
    if len(bad):
        keep = np.ones(scalars.height, dtype=bool)
        keep[bad] = False
        left_out = scalars[bad].select("rank", "stage", "worker", "iter").with_columns(strings)
        if not keep.any():
            msg = (f"run {run_id!r} holds no iteration tlog can analyse: all {len(bad)} have a "
                   f"duration or phase time that is negative, not finite or longer than a day "
                   f"(written before ingest rejected such values); re-ingest its logs")
            raise RunNotFoundError(msg)
        scalars = scalars.with_row_index("src").filter(pl.Series(keep))
        notes.append(f"{len(bad)} iterations were left out: a duration or phase time is "
                     f"negative, not finite or longer than a day (written before ingest "
                     f"rejected such values; their sums would overflow)")
    it, workers = _order(scalars)
    names, layouts = _layouts(con, run_id, group)
    # A list longer or shorter than its layout (never written by ingest): use the overlap.
    lay_len = {k: len(v) for k, v in layouts.items()}
    if it["layout"].drop_nulls().len():
        ids = np.array(sorted(lay_len), dtype=np.int64)
        lens = np.array([lay_len[int(i)] for i in ids], dtype=np.int64)
        lay_all = it["layout"].fill_null(-1).to_numpy()
        src_all = it["src"].to_numpy()
        bad = 0
        # In blocks of rows: the whole run's index arrays here came to about
        # 250 MiB at 10M iterations, next to every phase time.
        for a in range(0, len(lay_all), BATCH_ROWS):
            lay = lay_all[a:a + BATCH_ROWS]
            at = np.clip(np.searchsorted(ids, lay), 0, max(len(ids) - 1, 0))
            want = np.where((lay >= 0) & (ids[at] == lay), lens[at], 0) if len(ids) else 0
            bad += int((want != length[src_all[a:a + BATCH_ROWS]]).sum())
        del lay_all, src_all
        if bad:
            notes.append(f"{bad} iterations have phase lists that do not match their layout; "
                         f"only the matching positions are used")
    # What the trace converter had to assume (ingest prints these too).
    # which files' meta the notes below read (one query, not one per reader)
    sources = (dict(con.execute(_SOURCES_SQL.format(rows="run_id = $run"),
                                {"run": run_id}).fetchall())
               if group is None else group.sources.get(run_id, {}))
    if "kineto" in sources:
        notes += [f"trace conversion: {w}" for w in stored_warnings(con, run_id)]
    if any(sources.values()):
        notes += stored_shim_drops(con, run_id)
    timer_logs = "timer_log" in sources
    if timer_logs:
        notes += timer_log_notes(con, run_id)
    def read(table: str, reader: Any) -> Any:
        """``reader()``, or for a run of the group that holds no row of
        ``table``, the empty result of that read (made once)."""
        if group is None or run_id in group.held[table]:
            return reader()
        return group.empty(table, reader).clear()

    queues = read("queue_samples", lambda: _frame(con, _rows(_QUEUES_SQL, since), run_id, since))
    events = read("events", lambda: _frame(con, _rows(_EVENTS_SQL, since, spans=True), run_id,
                                           since))
    # The wall time before each iteration (a `for batch in loader:` fetch) is part
    # of it (analyze.gaps): throughput is what the loop's own it/s shows.
    it, pauses = absorb_gaps(it, events)
    if (note := pauses_note(pauses)) is not None:
        notes.append(note)
    known = (_frame(con, _HOSTS_SQL.format(rows="run_id = $run"), run_id) if group is None
             else group.hosts_of(run_id))
    hosts: dict[int, str | None] = dict.fromkeys(workers["wid"].to_list())
    if known.height:
        for wid, name in workers.join(known, on=["stage", "rank", "worker"],
                                      how="inner").select("wid", "host").iter_rows():
            hosts[int(wid)] = name
    return RunData(run_id=run_id, run=run, iterations=it, workers=workers, phase_names=names,
                   layouts=layouts, hosts=hosts, times=times,
                   queues=queues, events=events, notes=notes, left_out=left_out,
                   system=_system(con, run_id, since, group),
                   intervals=stored_intervals(con, run_id) if timer_logs else {},
                   _device_times=has_gpu)
