"""The tlog database: where it lives, how it is opened, and its schema.

One DuckDB file holds many runs. Its tables and views are a documented, stable
interface (``docs/DATABASE.md``): users write SQL against them. The schema
version is kept in ``tlog_schema``; :func:`connect` creates a new database at
the current version and migrates an older one forward, one step at a time.

Units everywhere: durations in seconds (DOUBLE), wall-clock timestamps in Unix
epoch seconds (DOUBLE), memory in bytes (BIGINT).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import duckdb

from ingest.errors import DatabaseError

#: Version of the schema this code writes. Bump it and add a step to
#: :data:`MIGRATIONS` for every change to a table or view.
SCHEMA_VERSION = 1

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
    run_id    VARCHAR NOT NULL,
    path      VARCHAR NOT NULL,  -- relative to the run root
    size      BIGINT,            -- bytes at last ingest
    "offset"  BIGINT,            -- bytes consumed: end of the last complete line read
    lines     BIGINT,            -- complete lines consumed
    head_hash VARCHAR,           -- fingerprint of the file's first bytes (rewrite detection)
    mtime     DOUBLE,
    meta      JSON,              -- the file's meta defaults (rank, stage, worker, host, pid, ...)
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
    extra             JSON              -- unknown fields, kept
);
CREATE TABLE IF NOT EXISTS phases (
    run_id   VARCHAR NOT NULL,
    rank     INTEGER NOT NULL,
    stage    VARCHAR NOT NULL,
    worker   VARCHAR NOT NULL,
    iter     BIGINT NOT NULL,
    seq      INTEGER NOT NULL,  -- 0-based position in the record's phases (then gpu-only keys)
    phase    VARCHAR NOT NULL,  -- full name, e.g. 'forward' or 'forward/mask_build'
    parent   VARCHAR,           -- NULL for a top-level phase, else the part before the last '/'
    host_s   DOUBLE,            -- host wall time, s (NULL for a gpu-only key)
    gpu_s    DOUBLE,            -- device time, s (NULL when not measured)
    category VARCHAR NOT NULL   -- starvation|backpressure|compute|sync (host rules)
);
CREATE TABLE IF NOT EXISTS queue_samples (
    run_id   VARCHAR NOT NULL,
    rank     INTEGER,
    stage    VARCHAR,
    worker   VARCHAR,
    name     VARCHAR NOT NULL,
    ts       DOUBLE NOT NULL,
    depth    BIGINT NOT NULL,
    capacity BIGINT
);
CREATE TABLE IF NOT EXISTS events (
    run_id VARCHAR NOT NULL,
    rank   INTEGER,
    stage  VARCHAR,
    worker VARCHAR,
    name   VARCHAR NOT NULL,
    ts     DOUBLE NOT NULL,
    dur    DOUBLE NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS rejects (
    run_id VARCHAR NOT NULL,
    file   VARCHAR NOT NULL,
    line   BIGINT NOT NULL,
    reason VARCHAR NOT NULL,
    raw    VARCHAR              -- the line, cut to 2,000 characters
);
"""

_VIEWS = """
CREATE OR REPLACE VIEW iteration_categories AS
SELECT i.run_id, i.rank, i.stage, i.worker, i.iter, i.ts, i.dur, i.tokens, i.samples,
       coalesce(sum(p.host_s) FILTER (WHERE p.parent IS NULL AND p.category = 'starvation'), 0)   AS starvation_s,
       coalesce(sum(p.host_s) FILTER (WHERE p.parent IS NULL AND p.category = 'backpressure'), 0) AS backpressure_s,
       coalesce(sum(p.host_s) FILTER (WHERE p.parent IS NULL AND p.category = 'compute'), 0)      AS compute_s,
       coalesce(sum(p.host_s) FILTER (WHERE p.parent IS NULL AND p.category = 'sync'), 0)         AS sync_s,
       greatest(i.dur - coalesce(sum(p.host_s) FILTER (WHERE p.parent IS NULL), 0), 0)            AS unaccounted_s
FROM iterations i
LEFT JOIN phases p USING (run_id, rank, stage, worker, iter)
GROUP BY i.run_id, i.rank, i.stage, i.worker, i.iter, i.ts, i.dur, i.tokens, i.samples;
"""

#: Migration steps: ``MIGRATIONS[v]`` turns a version-``v`` database into ``v+1``.
MIGRATIONS: dict[int, str] = {}


def default_db_path() -> Path:
    """The database file: ``$TLOG_DB`` if set, else ``tlog.duckdb`` in the
    user's data directory (platformdirs, e.g. ``~/.local/share/tlog``)."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("tlog", appauthor=False)) / "tlog.duckdb"


def connect(path: str | os.PathLike[str] | None = None, *, read_only: bool = False,
            wait_s: float = 0.0) -> duckdb.DuckDBPyConnection:
    """Open (and create or migrate) the tlog database.

    Args:
        path: database file; ``None`` means :func:`default_db_path`.
        read_only: open read-only (no schema creation or migration; the file must exist).
        wait_s: how long to keep retrying while another process holds the write lock.

    Raises:
        DatabaseError: the file is missing (read-only), locked by another
            process past ``wait_s``, not a DuckDB file, or of a newer schema.
    """
    db = Path(path).expanduser() if path is not None else default_db_path()
    if read_only and not db.exists():
        msg = f"no database at {db}: run 'tlog ingest RUN_DIR' first, or pass --db PATH"
        raise DatabaseError(msg)
    if not read_only:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            msg = f"cannot create the database directory {db.parent}: {exc.strerror}"
            raise DatabaseError(msg) from exc
    deadline = time.monotonic() + wait_s
    while True:
        try:
            con = duckdb.connect(str(db), read_only=read_only)
            break
        except duckdb.IOException as exc:
            text = str(exc)
            if "lock" in text.lower():
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                msg = f"database {db} is in use by another tlog process; wait for it to finish or use --db"
                raise DatabaseError(msg) from exc
            msg = f"cannot open database {db}: {text.splitlines()[0]}"
            raise DatabaseError(msg) from exc
        except duckdb.Error as exc:
            msg = f"cannot open database {db}: {str(exc).splitlines()[0]}"
            raise DatabaseError(msg) from exc
    if not read_only:
        _ensure_schema(con, db)
    else:
        _check_version(con, db)
    return con


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The schema version recorded in the database (0 when it has none)."""
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'tlog_schema'"
    ).fetchall()[0][0]
    if not exists:
        return 0
    row = con.execute("SELECT max(version) FROM tlog_schema").fetchall()[0]
    return int(row[0] or 0)


def _check_version(con: duckdb.DuckDBPyConnection, db: Path) -> int:
    version = schema_version(con)
    if version > SCHEMA_VERSION:
        msg = (f"database {db} has schema version {version}, newer than this tlog "
               f"understands ({SCHEMA_VERSION}); upgrade tlog")
        raise DatabaseError(msg)
    return version


def _ensure_schema(con: duckdb.DuckDBPyConnection, db: Path) -> None:
    version = _check_version(con, db)
    if version == SCHEMA_VERSION:
        return
    con.execute("BEGIN TRANSACTION")
    try:
        if version == 0:
            con.execute(_TABLES)
        else:
            for step in range(version, SCHEMA_VERSION):
                con.execute(MIGRATIONS[step])
        con.execute(_VIEWS)
        con.execute("INSERT INTO tlog_schema (version) VALUES (?)", [SCHEMA_VERSION])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
