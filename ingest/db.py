"""The tlog database: where it lives, how it is opened, and its schema.

One DuckDB file holds many runs. Its tables and views are a documented, stable
interface (``docs/DATABASE.md``): users write SQL against them. The schema
version is kept in ``tlog_schema``; :func:`connect` creates a new database at
the current version and migrates an older one forward, one step at a time.

Units everywhere: durations in seconds (DOUBLE), wall-clock timestamps in Unix
epoch seconds (DOUBLE), memory in bytes (BIGINT).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import duckdb
from tlog.ingest.errors import DatabaseError, DatabaseLockedError
from tlog.ingest.threads import threads_from_env

from dflash_runtime.format import PHASE_CATEGORIES, categorize

#: Version of the schema this code writes. Bump it and add a step to
#: :data:`MIGRATIONS` for every change to a table or view.
#: v1: the scaffold (a physical ``phases`` table).
#: v2: phase times stored as lists in ``iterations`` with ``phase_layouts``;
#:     ``phases`` became a view with the same columns; ``file``/``line``/``extra``
#:     on ``queue_samples`` and ``events``; ``rejects.code``; ``files.source``.
#: v3: view ``iteration_positions`` (each iteration's position in its worker and
#:     whether it overlaps an event) and the private table macro ``_run_throughput``.
#: v4: ``phase_layouts.given``, the category a record's ``kinds`` gave, so that
#:     the others can follow a later ``run.json`` ``phase_kinds`` (tlog.ingest.recategorize).
#: v5: the stored diagnosis (``attribution``, ``attribution_phases``,
#:     ``attribution_stages``, ``attribution_runs``; written by
#:     ``tlog.analyze.persist``), and ``_run_throughput`` reads it.
#: v6: ``sys_samples`` (the shim's ``sys`` records and a trace's ``[memory]``
#:     events) and ``machines`` (a ``meta`` record's ``machine``), :data:`SYS_TABLES`.
#: v7: ``sys_samples.cpu_wait_s`` (the recording threads' run-queue wait).
#: v8: ``attribution_runs.analysis_version`` is text: a digest of the analysis
#:     code (``tlog.analyze.persist.analysis_key``), not a number.
SCHEMA_VERSION = 8

#: Environment variable naming the database file (SCHEMA/DESIGN: ``TLOG_DB``).
DB_ENV = "TLOG_DB"

_TABLES = """
CREATE TABLE IF NOT EXISTS tlog_schema (
    version    INTEGER NOT NULL,
    applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS runs (
    run_id         VARCHAR PRIMARY KEY,
    name           VARCHAR,
    source         VARCHAR NOT NULL DEFAULT 'jsonl',  -- 'jsonl' or 'kineto'
    root           VARCHAR,     -- absolute path of the run directory (or trace file)
    started        DOUBLE,      -- epoch s: manifest 'started', else first iteration ts
    world_size     INTEGER,
    tags           JSON,        -- manifest 'tags' object
    config         JSON,        -- manifest 'config' object
    phase_kinds    JSON,        -- manifest 'phase_kinds' object
    manifest       JSON,        -- the whole run.json
    first_ingested TIMESTAMP,
    last_ingested  TIMESTAMP
);
CREATE TABLE IF NOT EXISTS files (
    run_id      VARCHAR NOT NULL,
    path        VARCHAR NOT NULL,  -- relative to the run root
    size        BIGINT,            -- bytes on disk at last ingest
    "offset"    BIGINT,            -- bytes consumed: end of the last complete line read
                                   -- (of the decompressed / decoded text for .gz and traces)
    lines       BIGINT,            -- complete lines consumed
    head_hash   VARCHAR,           -- blake2b of the first min(offset, 4096) bytes on disk
    mtime       DOUBLE,
    meta        JSON,              -- the file's meta defaults (rank, stage, worker, host, pid, ...)
    source      VARCHAR NOT NULL DEFAULT 'jsonl',  -- decoder: 'jsonl', 'jsonl.gz', 'kineto'
    ingested_at TIMESTAMP,
    PRIMARY KEY (run_id, path)
);
CREATE TABLE IF NOT EXISTS workers (
    run_id     VARCHAR NOT NULL,
    rank       INTEGER NOT NULL,
    stage      VARCHAR NOT NULL,
    worker     VARCHAR NOT NULL,
    host       VARCHAR,
    pid        BIGINT,
    world_size INTEGER,
    clock_wall DOUBLE,           -- time.time() at the meta line
    clock_mono DOUBLE,           -- time.perf_counter() read at the same moment
    file       VARCHAR
);
CREATE TABLE IF NOT EXISTS iterations (
    run_id            VARCHAR NOT NULL,
    rank              INTEGER NOT NULL,
    stage             VARCHAR NOT NULL,
    worker            VARCHAR NOT NULL,
    iter              BIGINT NOT NULL,
    ts                DOUBLE NOT NULL,  -- wall-clock start, epoch s
    dur               DOUBLE NOT NULL,  -- wall time, s
    cpu               DOUBLE,           -- recording thread's CPU time, s
    tokens            BIGINT,
    samples           BIGINT,
    mem_allocated     BIGINT,           -- bytes
    mem_reserved      BIGINT,           -- bytes
    mem_alloc_retries BIGINT,           -- cumulative count
    mem_device_allocs BIGINT,           -- cumulative count
    file              VARCHAR,
    line              BIGINT,
    extra             JSON,             -- unknown fields, kept
    layout            INTEGER,          -- phase_layouts.layout of this iteration (NULL: no phases)
    phase_host_s      DOUBLE[],         -- host s per phase, in layout order (NULL: gpu-only key)
    phase_gpu_s       DOUBLE[]          -- device s per phase, in layout order (NULL list: none measured)
);
CREATE TABLE IF NOT EXISTS phase_layouts (
    run_id   VARCHAR NOT NULL,
    layout   INTEGER NOT NULL,
    seq      INTEGER NOT NULL,   -- 0-based position (record's phases order, then gpu-only keys)
    phase    VARCHAR NOT NULL,
    parent   VARCHAR,            -- NULL for a top-level phase, else the part before the last '/'
    category VARCHAR NOT NULL,   -- starvation|backpressure|compute|sync (host rules)
    given    VARCHAR,            -- the category the record's 'kinds' gave (NULL: none, so
                                 -- run.json phase_kinds, else the name rules, decide)
    PRIMARY KEY (run_id, layout, seq)
);
CREATE TABLE IF NOT EXISTS queue_samples (
    run_id   VARCHAR NOT NULL,
    rank     INTEGER,
    stage    VARCHAR,
    worker   VARCHAR,
    name     VARCHAR NOT NULL,
    ts       DOUBLE NOT NULL,
    depth    BIGINT NOT NULL,
    capacity BIGINT,
    file     VARCHAR,
    line     BIGINT,
    extra    JSON
);
CREATE TABLE IF NOT EXISTS events (
    run_id VARCHAR NOT NULL,
    rank   INTEGER,
    stage  VARCHAR,
    worker VARCHAR,
    name   VARCHAR NOT NULL,
    ts     DOUBLE NOT NULL,
    dur    DOUBLE NOT NULL DEFAULT 0,
    file   VARCHAR,
    line   BIGINT,
    extra  JSON
);
CREATE TABLE IF NOT EXISTS rejects (
    run_id VARCHAR NOT NULL,
    file   VARCHAR NOT NULL,
    line   BIGINT NOT NULL,
    reason VARCHAR NOT NULL,
    raw    VARCHAR,             -- the line, cut to 2,000 characters
    code   VARCHAR              -- reason class: not_json, not_object, missing_field, ...
);
"""

#: The machine as evidence (schema v6; docs/DATABASE.md "System samples"):
#: ``sys_samples`` holds one row per ``sys`` record (docs/FORMAT.md; the shim
#: samples every 2 s by default) and per device ``[memory]`` event of a
#: torch.profiler trace (docs/KINETO.md); ``machines`` one row per worker whose
#: ``meta`` described its machine. NULL: not measured.
SYS_TABLES = """
CREATE TABLE IF NOT EXISTS sys_samples (
    run_id               VARCHAR NOT NULL,
    worker               VARCHAR,
    ts                   DOUBLE NOT NULL,  -- epoch s, the time base of iterations.ts
    iter                 BIGINT,           -- last iteration the worker's recorder started
    cpu_s                DOUBLE,           -- process CPU s (user + system) since it started
    rss_bytes            BIGINT,           -- process resident memory
    ncpu                 INTEGER,          -- cores the process may run on (affinity)
    load1                DOUBLE,           -- the machine's 1-minute load average
    threads              INTEGER,          -- the process's threads
    running              INTEGER,          -- of them runnable (state R), the sampler left out
    cpu_wait_s           DOUBLE,           -- s the recording threads waited runnable for a CPU
    cuda_allocated       BIGINT,           -- bytes, torch's caching allocator, current device
    cuda_reserved        BIGINT,           -- bytes
    cuda_retries         BIGINT,           -- cumulative count of allocation retries
    cuda_limit           BIGINT,           -- bytes the allocator may hold
    gpu_util             DOUBLE,           -- percent (NVML)
    gpu_mem_used         BIGINT,           -- bytes (NVML: every process on the device)
    gpu_mem_total        BIGINT,           -- bytes
    gpu_temp_c           DOUBLE,           -- Celsius
    gpu_sm_clock_mhz     DOUBLE,
    gpu_sm_clock_max_mhz DOUBLE,
    gpu_power_w          DOUBLE,           -- watts
    gpu_throttle         BIGINT,           -- NVML clocks-event reasons (bitmask)
    file                 VARCHAR,
    line                 BIGINT,
    extra                JSON              -- unknown fields, kept
);
CREATE TABLE IF NOT EXISTS machines (
    run_id    VARCHAR NOT NULL,
    worker    VARCHAR NOT NULL,
    host      VARCHAR,
    cpu_model VARCHAR,
    ncpu      INTEGER,   -- the machine's cores (os.cpu_count())
    mem_total BIGINT,    -- bytes of memory
    gpu_name  VARCHAR,
    gpu_count INTEGER,
    driver    VARCHAR,   -- GPU driver version
    cuda      VARCHAR,   -- CUDA version
    file      VARCHAR
);
"""

#: The stored diagnosis (schema v5): what ``tlog diagnose`` computed for each run,
#: written by ``tlog.analyze.persist.ensure_attribution`` and read by the stored
#: queries and ``tlog runs`` (docs/DATABASE.md "Stored diagnosis"). Keyed by
#: ``attribution_runs.data_key`` and ``analysis_version`` (a digest of the
#: analysis code): rows of a run whose data or analysis changed are recomputed
#: before they are read.
ATTRIBUTION_TABLES = """
CREATE TABLE IF NOT EXISTS attribution (
    run_id         VARCHAR NOT NULL,
    rank           INTEGER,
    stage          VARCHAR NOT NULL,
    worker         VARCHAR NOT NULL,
    iter           BIGINT NOT NULL,
    ts             DOUBLE NOT NULL,   -- epoch s
    dur            DOUBLE NOT NULL,   -- wall time, s
    tokens         BIGINT,
    samples        BIGINT,
    base_s         DOUBLE NOT NULL,   -- max(dur, sum of top-level phases), s: the time base
    starvation_s   DOUBLE NOT NULL,   -- s per category after the device-backlog walk and the
    backpressure_s DOUBLE NOT NULL,   -- collective split; the five sum to base_s
    compute_s      DOUBLE NOT NULL,
    sync_s         DOUBLE NOT NULL,
    unaccounted_s  DOUBLE NOT NULL,
    gpu_s          DOUBLE,            -- device s of top-level phases (NULL: none measured)
    pos            BIGINT NOT NULL,   -- 1-based position in its worker, iter order
    steady         BOOLEAN NOT NULL,  -- in tlog diagnose's steady state
    excluded       VARCHAR,           -- why not: warmup | event | attempt (NULL: steady)
    warmup         BOOLEAN NOT NULL,  -- in the detected warm-up
    in_event       BOOLEAN NOT NULL,  -- overlaps an event diagnose leaves out
    attempt        BOOLEAN NOT NULL   -- of an attempt of a restarted stage not judged
);
CREATE TABLE IF NOT EXISTS attribution_phases (
    run_id         VARCHAR NOT NULL,
    rank           INTEGER,
    stage          VARCHAR NOT NULL,
    worker         VARCHAR NOT NULL,
    phase          VARCHAR NOT NULL,
    parent         VARCHAR,           -- NULL for a top-level phase
    category       VARCHAR NOT NULL,  -- host-rule category of these rows
    iterations     BIGINT NOT NULL,   -- steady iterations of the worker that record it
    host_s         DOUBLE NOT NULL,   -- host s, steady iterations
    gpu_s          DOUBLE,            -- device s (NULL: none measured)
    starvation_s   DOUBLE NOT NULL,   -- attributed s per category, steady iterations
    backpressure_s DOUBLE NOT NULL,
    compute_s      DOUBLE NOT NULL,
    sync_s         DOUBLE NOT NULL,
    attributed_s   DOUBLE NOT NULL
);
CREATE TABLE IF NOT EXISTS attribution_stages (
    run_id VARCHAR NOT NULL,
    stage  VARCHAR NOT NULL,
    pos    INTEGER NOT NULL           -- 1-based pipeline order of tlog diagnose's stages
                                      -- (stages without a steady iteration last, by name)
);
CREATE TABLE IF NOT EXISTS attribution_runs (
    run_id           VARCHAR PRIMARY KEY,
    data_key         VARCHAR NOT NULL,  -- digest of the run's stored data when computed
    analysis_version VARCHAR NOT NULL,  -- tlog.analyze.persist.analysis_key()
    computed_at      TIMESTAMP NOT NULL,
    iterations       BIGINT,            -- all iterations
    steady           BIGINT,            -- steady iterations
    iters_per_s      DOUBLE,            -- the run's throughput, as tlog diagnose
    tokens_per_s     DOUBLE,
    samples_per_s    DOUBLE,
    verdict          VARCHAR,
    confidence       VARCHAR,
    diagnosis        JSON               -- tlog diagnose --json (NULL: no iterations)
);
"""

#: The body of the private table macro ``_run_throughput(warmup_iters)``: each run's
#: steady throughput from the stored diagnosis, as ``tlog diagnose`` gives it. Kept
#: apart so that a run lake (tlog.queries.lake_sql), which has no macros, can inline it.
RUN_THROUGHPUT_SQL = """
WITH per_worker AS (
    SELECT run_id, stage, rank, worker, count(*) AS iterations, sum(dur) AS wall_s,
           sum(tokens) AS tokens
    FROM attribution
    WHERE CASE WHEN warmup_iters IS NULL THEN steady
               ELSE pos > warmup_iters AND NOT in_event AND NOT attempt END
    GROUP BY run_id, stage, rank, worker
),
per_stage AS (
    SELECT w.run_id, w.stage, sum(w.iterations)::BIGINT AS iterations,
           avg(w.iterations / nullif(w.wall_s, 0)) AS iters_per_s,
           sum(w.tokens / nullif(w.wall_s, 0)) AS tokens_per_s,
           any_value(o.pos) AS pos
    FROM per_worker AS w
    JOIN attribution_stages AS o USING (run_id, stage)
    GROUP BY w.run_id, w.stage
)
SELECT run_id, arg_max(stage, pos) AS stage, arg_max(iterations, pos) AS iterations,
       arg_max(iters_per_s, pos) FILTER (WHERE iters_per_s IS NOT NULL) AS iters_per_s,
       arg_max(tokens_per_s, pos) FILTER (WHERE tokens_per_s IS NOT NULL) AS tokens_per_s
FROM per_stage
GROUP BY run_id;
"""

_VIEWS = """
CREATE OR REPLACE VIEW phases AS
SELECT i.run_id, i.rank, i.stage, i.worker, i.iter, l.seq, l.phase, l.parent,
       i.phase_host_s[l.seq + 1] AS host_s, i.phase_gpu_s[l.seq + 1] AS gpu_s, l.category
FROM iterations i
JOIN phase_layouts l ON l.run_id = i.run_id AND l.layout = i.layout;
CREATE OR REPLACE VIEW _phase_layout_masks AS
SELECT run_id, layout,
       list(category = 'starvation' AND parent IS NULL ORDER BY seq)   AS m_starvation,
       list(category = 'backpressure' AND parent IS NULL ORDER BY seq) AS m_backpressure,
       list(category = 'compute' AND parent IS NULL ORDER BY seq)      AS m_compute,
       list(category = 'sync' AND parent IS NULL ORDER BY seq)         AS m_sync,
       list(parent IS NULL ORDER BY seq)                               AS m_top
FROM phase_layouts GROUP BY run_id, layout;
CREATE OR REPLACE VIEW iteration_categories AS
SELECT i.run_id, i.rank, i.stage, i.worker, i.iter, i.ts, i.dur, i.tokens, i.samples,
       coalesce(list_sum(list_where(i.phase_host_s, m.m_starvation)), 0)   AS starvation_s,
       coalesce(list_sum(list_where(i.phase_host_s, m.m_backpressure)), 0) AS backpressure_s,
       coalesce(list_sum(list_where(i.phase_host_s, m.m_compute)), 0)      AS compute_s,
       coalesce(list_sum(list_where(i.phase_host_s, m.m_sync)), 0)         AS sync_s,
       greatest(i.dur - coalesce(list_sum(list_where(i.phase_host_s, m.m_top)), 0), 0)
                                                                           AS unaccounted_s
FROM iterations i
LEFT JOIN _phase_layout_masks m ON m.run_id = i.run_id AND m.layout = i.layout;
CREATE OR REPLACE VIEW iteration_positions AS
SELECT c.*,
       row_number() OVER (PARTITION BY c.run_id, c.rank, c.stage, c.worker ORDER BY c.iter) AS pos,
       EXISTS (SELECT 1 FROM events AS e
               WHERE e.run_id = c.run_id AND e.ts < c.ts + c.dur
                 AND (e.ts + e.dur > c.ts OR e.ts >= c.ts)) AS in_event
FROM iteration_categories AS c;
CREATE OR REPLACE MACRO _run_throughput(warmup_iters) AS TABLE
""" + RUN_THROUGHPUT_SQL


_SHARED: ContextVar[bool] = ContextVar("tlog_shared_database", default=False)


@contextmanager
def sharing_database() -> Iterator[None]:
    """Within the block (this thread or task), the connection is one of several
    threads' cursors of one database (``tlog serve``): DuckDB's memory limit, a
    setting of the whole database, is left alone. Ingest and diagnosis lower it
    for a moment on a connection of their own; done beside another thread's
    query, that query failed with an out-of-memory error."""
    token = _SHARED.set(True)
    try:
        yield
    finally:
        _SHARED.reset(token)


def memory_limit_is_shared() -> bool:
    """Whether :func:`sharing_database` is in force here (leave ``memory_limit``
    and ``threads``, settings of the whole database, alone)."""
    return _SHARED.get()


def _migrate_v1_to_v2(con: duckdb.DuckDBPyConnection) -> None:
    """v1 -> v2: move the rows of the physical ``phases`` table into per-iteration
    lists plus ``phase_layouts``; add the new columns; the views are rebuilt after."""
    con.execute("""
    DROP VIEW IF EXISTS iteration_categories;
    ALTER TABLE iterations ADD COLUMN layout INTEGER;
    ALTER TABLE iterations ADD COLUMN phase_host_s DOUBLE[];
    ALTER TABLE iterations ADD COLUMN phase_gpu_s DOUBLE[];
    CREATE TABLE phase_layouts (
        run_id VARCHAR NOT NULL, layout INTEGER NOT NULL, seq INTEGER NOT NULL,
        phase VARCHAR NOT NULL, parent VARCHAR, category VARCHAR NOT NULL,
        PRIMARY KEY (run_id, layout, seq));
    CREATE TEMP TABLE _m_it AS
        SELECT run_id, rank, stage, worker, iter,
               list(phase ORDER BY seq) AS names, list(category ORDER BY seq) AS cats,
               list(host_s ORDER BY seq) AS host, list(gpu_s ORDER BY seq) AS gpu
        FROM phases GROUP BY run_id, rank, stage, worker, iter;
    CREATE TEMP TABLE _m_lay AS
        SELECT run_id, names, cats,
               (row_number() OVER (PARTITION BY run_id ORDER BY names::VARCHAR, cats::VARCHAR) - 1)::INTEGER
                   AS layout
        FROM (SELECT DISTINCT run_id, names, cats FROM _m_it);
    INSERT INTO phase_layouts
        SELECT run_id, layout, (generate_subscripts(names, 1) - 1)::INTEGER, unnest(names), NULL,
               unnest(cats)
        FROM _m_lay;
    UPDATE phase_layouts SET parent = regexp_extract(phase, '^(.*)/[^/]*$', 1)
        WHERE contains(phase, '/');
    UPDATE iterations SET layout = x.layout, phase_host_s = x.host,
           phase_gpu_s = CASE WHEN list_count(x.gpu) > 0 THEN x.gpu END
        FROM (SELECT m.*, l.layout FROM _m_it m JOIN _m_lay l USING (run_id, names, cats)) x
        WHERE iterations.run_id = x.run_id AND iterations.rank = x.rank
          AND iterations.stage = x.stage AND iterations.worker = x.worker
          AND iterations.iter = x.iter;
    DROP TABLE _m_it;
    DROP TABLE _m_lay;
    DROP TABLE phases;
    ALTER TABLE queue_samples ADD COLUMN file VARCHAR;
    ALTER TABLE queue_samples ADD COLUMN line BIGINT;
    ALTER TABLE queue_samples ADD COLUMN extra JSON;
    ALTER TABLE events ADD COLUMN file VARCHAR;
    ALTER TABLE events ADD COLUMN line BIGINT;
    ALTER TABLE events ADD COLUMN extra JSON;
    ALTER TABLE rejects ADD COLUMN code VARCHAR;
    ALTER TABLE files ADD COLUMN source VARCHAR DEFAULT 'jsonl';
    ALTER TABLE files ADD COLUMN ingested_at TIMESTAMP;
    """)


def _migrate_v2_to_v3(con: duckdb.DuckDBPyConnection) -> None:
    """v2 -> v3: no table changes; ``iteration_positions`` and ``_run_throughput``
    are created by the view rebuild that follows every migration."""


def _migrate_v3_to_v4(con: duckdb.DuckDBPyConnection) -> None:
    """v3 -> v4: add ``phase_layouts.given``. A v3 database did not keep which
    categories a record's ``kinds`` gave, so they are inferred: a category is
    taken as given when the run's stored ``phase_kinds`` does not name the
    phase and the name rules say otherwise. (A phase ``phase_kinds`` names,
    perhaps with another value at an earlier ingest, follows ``phase_kinds``
    from now on; one a record gave with the rules' own category follows a
    later ``phase_kinds`` entry for it.)"""
    con.execute("ALTER TABLE phase_layouts ADD COLUMN given VARCHAR")
    rows = con.execute("""SELECT DISTINCT l.run_id, l.phase, l.category, r.phase_kinds::VARCHAR
                          FROM phase_layouts l LEFT JOIN runs r USING (run_id)""").fetchall()
    given = [(category, run_id, phase, category)
             for run_id, phase, category, kinds_text in rows
             if phase not in stored_phase_kinds(kinds_text) and category != categorize(phase)]
    if given:
        con.executemany("UPDATE phase_layouts SET given = ? WHERE run_id = ? AND phase = ? "
                        "AND category = ?", given)


def _migrate_v4_to_v5(con: duckdb.DuckDBPyConnection) -> None:
    """v4 -> v5: the stored-diagnosis tables (:data:`ATTRIBUTION_TABLES`), empty:
    they are filled the first time a run is read (``tlog.analyze.persist``)."""
    con.execute(ATTRIBUTION_TABLES)


def _migrate_v5_to_v6(con: duckdb.DuckDBPyConnection) -> None:
    """v5 -> v6: ``sys_samples`` and ``machines`` (:data:`SYS_TABLES`), empty: a
    run ingested before has none (its logs, read again after ``tlog forget``,
    fill them if they hold ``sys`` records)."""
    con.execute(SYS_TABLES)


def _migrate_v6_to_v7(con: duckdb.DuckDBPyConnection) -> None:
    """v6 -> v7: ``sys_samples.cpu_wait_s`` (NULL for the samples loaded before)."""
    con.execute("ALTER TABLE sys_samples ADD COLUMN IF NOT EXISTS cpu_wait_s DOUBLE")


def _migrate_v7_to_v8(con: duckdb.DuckDBPyConnection) -> None:
    """v7 -> v8: ``attribution_runs.analysis_version`` becomes text. The numbers
    stored before match no digest, so those runs are recomputed on their next read."""
    con.execute("ALTER TABLE attribution_runs ALTER analysis_version TYPE VARCHAR")


def stored_phase_kinds(text: str | None) -> dict[str, str]:
    """``runs.phase_kinds`` (JSON text) as ``{phase: category}``; entries that are
    not a phase name and a category (a hand-edited database) are left out."""
    try:
        kinds = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(kinds, dict):
        return {}
    return {k: v for k, v in kinds.items() if isinstance(v, str) and v in PHASE_CATEGORIES}


#: Migration steps: ``MIGRATIONS[v]`` turns a version-``v`` database into ``v+1``
#: (SQL text, or a function of the connection). They run in one transaction with
#: the view rebuild and the new ``tlog_schema`` row, so a failed or killed
#: migration leaves the database at its old version.
MIGRATIONS: dict[int, str | Callable[[duckdb.DuckDBPyConnection], None]] = {
    1: _migrate_v1_to_v2,
    2: _migrate_v2_to_v3,
    3: _migrate_v3_to_v4,
    4: _migrate_v4_to_v5,
    5: _migrate_v5_to_v6,
    6: _migrate_v6_to_v7,
    7: _migrate_v7_to_v8,
}


def default_db_path() -> Path:
    """The database file: ``$TLOG_DB`` if set, else ``tlog.duckdb`` in the
    user's data directory (platformdirs, e.g. ``~/.local/share/tlog``)."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("tlog", appauthor=False)) / "tlog.duckdb"


#: Seconds a reader (``read_only``) waits for a writer holding the database
#: before failing. The longest hold is an ingest that stores the run's
#: diagnosis (``tlog ingest``, and ``--follow`` at most every 30 s): measured
#: 3-3.7 s at 300k iterations and 7-8 s at 1M (before the
#: attribution's memory work; 0.8-1.2 s at 300k after it), so 15 s rides out the store of
#: a run of a few million iterations. Source: tlog's choice: long enough for that,
#: short enough that a command never seems to hang (it was 5 s, which a 1M
#: iteration run's store outlasted).
READ_WAIT_S = 15.0


def query_threads() -> int | None:
    """``$TLOG_THREADS`` as a thread count (:func:`tlog.ingest.threads.threads_from_env`).

    Raises:
        DatabaseError: it is set to anything but a whole number >= 1.
    """
    try:
        return threads_from_env()
    except ValueError as exc:
        raise DatabaseError(str(exc)) from None


def _lock_holder(text: str) -> str:
    """``' (held by PID 123)'`` from DuckDB's lock error text, else ``''``."""
    m = re.search(r"\(PID (\d+)\)", text)
    return f" (held by PID {m.group(1)})" if m else ""


def connect(path: str | os.PathLike[str] | None = None, *, read_only: bool = False,
            wait_s: float | None = None) -> duckdb.DuckDBPyConnection:
    """Open (and create or migrate) the tlog database.

    Args:
        path: database file; ``None`` means :func:`default_db_path`.
        read_only: open read-only (no schema creation or migration; the file must exist).
        wait_s: how long to keep retrying while another process holds the write
            lock (seconds); default :data:`READ_WAIT_S` for a reader, 0 for a writer.

    Raises:
        DatabaseLockedError: another process holds the database past ``wait_s``
            (DuckDB allows one writing process per file).
        DatabaseError: the file is missing (read-only), not a DuckDB file, or
            of a newer schema; or ``$TLOG_THREADS`` is not a thread count
            (:func:`query_threads`, which sets DuckDB's ``threads``).
    """
    threads = query_threads()
    config = {"threads": threads} if threads else {}
    db = Path(path).expanduser() if path is not None else default_db_path()
    if db.is_dir():
        msg = (f"database path {db} is a directory: give a file, e.g. --db {db / 'tlog.duckdb'} "
               f"(or set ${DB_ENV})")
        raise DatabaseError(msg)
    if db.exists() and not db.is_file():
        msg = (f"database path {db} is not a regular file (a FIFO, device or socket): give "
               f"a file, e.g. --db tlog.duckdb (or set ${DB_ENV})")
        raise DatabaseError(msg)
    if read_only and not db.exists():
        msg = f"no database at {db}: run 'tlog ingest RUN_DIR' first, or pass --db PATH"
        raise DatabaseError(msg)
    if not read_only:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            msg = f"cannot create the database directory {db.parent}: {exc.strerror}"
            raise DatabaseError(msg) from exc
    if wait_s is None:
        wait_s = READ_WAIT_S if read_only else 0.0
    deadline = time.monotonic() + wait_s
    while True:
        try:
            con = duckdb.connect(str(db), read_only=read_only, config=config)
            break
        except duckdb.IOException as exc:
            text = str(exc)
            if "lock" in text.lower():
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                waited = f" (waited {wait_s:g} s)" if wait_s > 0 else ""
                msg = (f"database {db} is in use by another tlog process"
                       f"{_lock_holder(text)}{waited}; wait for it to finish or use --db")
                raise DatabaseLockedError(msg) from exc
            if "not a valid DuckDB database" in text:
                msg = (f"{db} is not a tlog database (not a DuckDB file); it was left "
                       f"untouched: pass --db with another path (or set ${DB_ENV})")
            else:
                msg = f"cannot open database {db}: {text.splitlines()[0]}"
            raise DatabaseError(msg) from exc
        except duckdb.Error as exc:
            first = str(exc).splitlines()[0]
            msg = f"cannot open database {db}: {first}"
            if any(w in first.lower() for w in ("corrupt", "checksum")):
                msg = (f"the database {db} looks damaged ({first[:120]}): keep a copy of the "
                       f"file, then move it away and ingest the runs again into a new one "
                       f"(tlog ingest RUN_DIR --db NEW)")
            raise DatabaseError(msg) from exc
    try:
        # One read of the version serves all three checks (each read costs ~4 ms
        # of catalog queries; a re-ingest of an unchanged run pays connect).
        version = _check_is_tlog(con, db, read_only)
        _check_version(version, db)
        if not read_only:
            _ensure_schema(con, version)
    except BaseException:
        con.close()
        raise
    return con


def _check_is_tlog(con: duckdb.DuckDBPyConnection, db: Path, read_only: bool) -> int:
    """Refuse a DuckDB file that is not a tlog database: one with tables but no
    ``tlog_schema`` (never write tlog's tables into someone else's database), or
    an empty one opened read-only (nothing to read). Returns its schema version
    (0: a new, empty file)."""
    if version := schema_version(con):
        return version
    tables = con.execute("SELECT count(*) FROM information_schema.tables").fetchall()[0][0]
    if tables or read_only:
        what = "holds other tables" if tables else "is empty"
        msg = (f"{db} is a DuckDB file but not a tlog database (it {what} and no tlog_schema); "
               f"it was left untouched: pass --db with another path (or set ${DB_ENV})")
        raise DatabaseError(msg)
    return 0


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The schema version recorded in the database (0 when it has none).

    Reads ``tlog_schema`` directly and takes a missing table for 0: asking
    ``information_schema.tables`` first cost 7-8 ms of catalog scan, a fifth of
    a re-ingest of an unchanged run (which opens the database each time)."""
    try:
        row = con.execute("SELECT max(version) FROM main.tlog_schema").fetchall()[0]
    except duckdb.CatalogException:
        return 0
    return int(row[0] or 0)


def _check_version(version: int, db: Path) -> None:
    """Refuse a database written by a newer tlog (``version``: its schema version)."""
    if version > SCHEMA_VERSION:
        msg = (f"database {db} has schema version {version}, newer than this tlog "
               f"understands ({SCHEMA_VERSION}); upgrade tlog")
        raise DatabaseError(msg)


def _ensure_schema(con: duckdb.DuckDBPyConnection, version: int) -> None:
    """Create (version 0) or migrate the schema up to :data:`SCHEMA_VERSION`."""
    if version == SCHEMA_VERSION:
        return
    con.execute("BEGIN TRANSACTION")
    try:
        if version == 0:
            con.execute(_TABLES)
            con.execute(ATTRIBUTION_TABLES)
            con.execute(SYS_TABLES)
        else:
            for step in range(version, SCHEMA_VERSION):
                migration = MIGRATIONS[step]
                if callable(migration):
                    migration(con)
                else:
                    con.execute(migration)
        con.execute(_VIEWS)
        con.execute("INSERT INTO tlog_schema (version) VALUES (?)", [SCHEMA_VERSION])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
