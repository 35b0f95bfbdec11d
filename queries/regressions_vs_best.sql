-- Every run against the best run before it (the high-water mark so far).
-- Oldest first: each run's steady throughput, the best earlier run's, and
-- their ratio, so regressions (ratio below 1) and new bests stand out. Runs are
-- compared in tokens/s when one of their stages counts tokens, else in
-- iterations/s, and only with runs measured the same way. Throughput and steady
-- iterations as in runs_by_throughput. Filter by one tag with $tag_key and
-- $tag_value (both or neither) to follow one configuration.
--
-- Parameters:
--   $warmup_iters INTEGER = NULL: NULL: tlog diagnose's steady state; N: leave out the first N iterations of each worker instead of its detected warm-up.
--   $tag_key VARCHAR = NULL: only runs whose tags have this key ...
--   $tag_value VARCHAR = NULL: ... with this value.
--
-- Columns:
--   run_id VARCHAR: the run.
--   started_utc TIMESTAMP: when the run started (UTC).
--   unit VARCHAR: 'tokens/s' or 'iterations/s', the unit of the next three columns.
--   throughput DOUBLE (unit): the run's steady throughput.
--   best_before_run_id VARCHAR: the fastest run that started before this one; NULL for the first.
--   best_before DOUBLE (unit): that run's throughput.
--   ratio DOUBLE (ratio): throughput / best_before; below 1 is a regression.
--   new_best BOOLEAN: true when the run beats every earlier run (or is the first).
WITH chosen AS MATERIALIZED (  -- materialised: the tag check runs even if nothing is steady
    SELECT * FROM runs AS r
    WHERE CASE WHEN ($tag_key IS NULL) <> ($tag_value IS NULL)
               THEN error('give both $tag_key and $tag_value, or neither')
               ELSE $tag_key IS NULL OR r.tags ->> $tag_key = $tag_value END
),
measured AS (
    SELECT r.run_id, r.started,
           CASE WHEN l.tokens_per_s IS NULL THEN 'iterations/s' ELSE 'tokens/s' END AS unit,
           coalesce(l.tokens_per_s, l.iters_per_s) AS throughput
    FROM _run_throughput($warmup_iters) AS l
    JOIN chosen AS r USING (run_id)
),
ranked AS (
    SELECT m.*,
           arg_max(m.run_id, m.throughput) OVER earlier AS best_before_run_id,
           max(m.throughput) OVER earlier AS best_before
    FROM measured AS m
    WINDOW earlier AS (PARTITION BY m.unit ORDER BY m.started, m.run_id
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
)
SELECT run_id, make_timestamp((started * 1e6)::BIGINT) AS started_utc, unit, throughput,
       best_before_run_id, best_before, throughput / nullif(best_before, 0) AS ratio,
       coalesce(throughput > best_before, true) AS new_best
FROM ranked
ORDER BY started, run_id;
