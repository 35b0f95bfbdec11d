-- Runs ordered by steady throughput, fastest first. Highest tokens/s first;
-- runs without tokens after them, by iterations/s. A run's throughput is that of
-- its limiting stage: the stage with the lowest steady tokens/s (else
-- iterations/s), each stage's rate being the sum over its workers of work /
-- wall time. Steady iterations leave out the first $warmup_iters of each worker
-- and iterations overlapping an event. Filter by one tag with $tag_key and
-- $tag_value (both or neither).
--
-- Parameters:
--   $warmup_iters INTEGER = 10: iterations left out at the start of each worker (warm-up).
--   $tag_key VARCHAR = NULL: only runs whose tags have this key ...
--   $tag_value VARCHAR = NULL: ... with this value.
--   $limit INTEGER = 20: the most runs returned.
--
-- Columns:
--   run_id VARCHAR: the run.
--   name VARCHAR: the run's name from its manifest; NULL without one.
--   started_utc TIMESTAMP: when the run started (UTC).
--   tags VARCHAR: the run's tags, a JSON object.
--   stage VARCHAR: the limiting stage.
--   iterations BIGINT: steady iterations of the limiting stage, all workers.
--   iters_per_s DOUBLE (iterations/s): steady iterations per second of the limiting stage.
--   tokens_per_s DOUBLE (tokens/s): steady tokens per second of the limiting stage; NULL without tokens.
WITH chosen AS (
    SELECT r.run_id
    FROM runs AS r
    WHERE CASE WHEN ($tag_key IS NULL) <> ($tag_value IS NULL)
               THEN error('give both $tag_key and $tag_value, or neither')
               ELSE $tag_key IS NULL OR r.tags ->> $tag_key = $tag_value END
),
numbered AS (
    SELECT i.run_id, i.rank, i.stage, i.worker, i.iter, i.ts, i.dur, i.tokens,
           row_number() OVER (PARTITION BY i.run_id, i.rank, i.stage, i.worker ORDER BY i.iter) AS pos
    FROM iterations AS i
    JOIN chosen USING (run_id)
),
steady AS (
    SELECT n.* FROM numbered AS n
    WHERE n.pos > $warmup_iters
      AND NOT EXISTS (SELECT 1 FROM events AS e
                      WHERE e.run_id = n.run_id AND e.ts < n.ts + n.dur
                        AND (e.ts + e.dur > n.ts OR e.ts >= n.ts))
),
per_worker AS (
    SELECT run_id, stage, rank, worker, count(*) AS iterations, sum(dur) AS wall_s,
           sum(tokens) AS tokens
    FROM steady
    GROUP BY run_id, stage, rank, worker
),
per_stage AS (
    SELECT run_id, stage, sum(iterations)::BIGINT AS iterations,
           sum(iterations / nullif(wall_s, 0)) AS iters_per_s,
           sum(tokens / nullif(wall_s, 0)) AS tokens_per_s
    FROM per_worker
    GROUP BY run_id, stage
),
limiting AS (
    SELECT * FROM per_stage
    QUALIFY row_number() OVER (PARTITION BY run_id
                               ORDER BY tokens_per_s ASC NULLS LAST, iters_per_s ASC, stage) = 1
)
SELECT r.run_id, r.name, make_timestamp((r.started * 1e6)::BIGINT) AS started_utc,
       r.tags::VARCHAR AS tags, l.stage, l.iterations, l.iters_per_s, l.tokens_per_s
FROM limiting AS l
JOIN runs AS r USING (run_id)
ORDER BY l.tokens_per_s DESC NULLS LAST, l.iters_per_s DESC, r.run_id
LIMIT $limit;
