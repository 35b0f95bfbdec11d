-- Runs ordered by steady throughput, fastest first. Highest tokens/s first;
-- runs without tokens after them, by iterations/s. A run's throughput is that of
-- its output stage, as in 'tlog diagnose': stages in pipeline order (stages that
-- hand output on through a backpressure phase first, then by first steady
-- iteration, then by name), the last one that reports the unit. A stage's
-- tokens/s is the sum over its workers of tokens / wall time; its iterations/s
-- the mean over workers of iterations / wall time. Read from the stored
-- diagnosis (attribution, attribution_stages), so the figures are those of
-- 'tlog diagnose' and 'tlog runs': steady iterations as diagnose judges them,
-- or, with $warmup_iters, all but the first $warmup_iters of each worker (and
-- not event overlaps or attempts not judged). Filter by one tag with $tag_key
-- and $tag_value (both or neither).
--
-- Parameters:
--   $warmup_iters INTEGER = NULL: NULL: tlog diagnose's steady state; N: leave out the first N iterations of each worker instead of its detected warm-up.
--   $tag_key VARCHAR = NULL: only runs whose tags have this key ...
--   $tag_value VARCHAR = NULL: ... with this value.
--   $limit INTEGER = 20: the most runs returned.
--
-- Columns:
--   run_id VARCHAR: the run.
--   name VARCHAR: the run's name from its manifest; NULL without one.
--   started_utc TIMESTAMP: when the run started (UTC).
--   tags VARCHAR: the run's tags, a JSON object.
--   stage VARCHAR: the output stage (last in pipeline order).
--   iterations BIGINT: steady iterations of the output stage, all workers.
--   iters_per_s DOUBLE (iterations/s): steady iterations per second of the output stage.
--   tokens_per_s DOUBLE (tokens/s): steady tokens per second of the last stage counting tokens; NULL without tokens.
WITH chosen AS MATERIALIZED (  -- materialised: the tag check runs even if nothing is steady
    SELECT * FROM runs AS r
    WHERE CASE WHEN ($tag_key IS NULL) <> ($tag_value IS NULL)
               THEN error('give both $tag_key and $tag_value, or neither')
               ELSE $tag_key IS NULL OR r.tags ->> $tag_key = $tag_value END
)
SELECT r.run_id, r.name, make_timestamp((r.started * 1e6)::BIGINT) AS started_utc,
       r.tags::VARCHAR AS tags, l.stage, l.iterations, l.iters_per_s, l.tokens_per_s
FROM _run_throughput($warmup_iters) AS l
JOIN chosen AS r USING (run_id)
ORDER BY l.tokens_per_s DESC NULLS LAST, l.iters_per_s DESC, r.run_id
LIMIT $limit;
