-- tlog schema version 1 (the scaffold's ingest/db.py, commit e24ade2), for the v1 -> v2 migration test.
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
INSERT INTO tlog_schema (version) VALUES (1);
