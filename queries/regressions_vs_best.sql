-- Every run against the best run before it (the high-water mark so far).
-- Oldest first: each run's steady throughput, the best earlier run's, and
-- their ratio, so regressions (ratio below 1) and new bests stand out. Runs are
-- compared in tokens/s when one of their stages counts tokens, else in
-- iterations/s, and only with runs measured the same way. Throughput and steady
-- iterations as in runs_by_throughput. Filter by one tag with $tag_key and
-- $tag_value (both or neither) to follow one configuration.
--
-- Parameters:
--   $warmup_iters INTEGER = 10: iterations left out at the start of each worker (warm-up).
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
WITH chosen AS (
    SELECT r.run_id
    FROM runs AS r
    WHERE CASE WHEN ($tag_key IS NULL) <> ($tag_value IS NULL)
               THEN error('give both $tag_key and $tag_value, or neither')
               ELSE $tag_key IS NULL OR r.tags ->> $tag_key = $tag_value END
),
numbered AS (
    SELECT c.run_id, c.rank, c.stage, c.worker, c.iter, c.ts, c.dur, c.tokens, c.backpressure_s,
           row_number() OVER (PARTITION BY c.run_id, c.rank, c.stage, c.worker ORDER BY c.iter) AS pos
    FROM iteration_categories AS c
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
           sum(tokens) AS tokens, min(ts) AS first_ts, bool_or(backpressure_s > 0) AS has_put
    FROM steady
    GROUP BY run_id, stage, rank, worker
),
per_stage AS (
    SELECT run_id, stage, sum(iterations)::BIGINT AS iterations,
           avg(iterations / nullif(wall_s, 0)) AS iters_per_s,
           sum(tokens / nullif(wall_s, 0)) AS tokens_per_s,
           min(first_ts) AS first_ts, bool_or(has_put) AS has_put
    FROM per_worker
    GROUP BY run_id, stage
),
ordered AS (
    SELECT *, row_number() OVER (PARTITION BY run_id ORDER BY has_put DESC, first_ts, stage) AS pos
    FROM per_stage
),
output AS (
    SELECT run_id, arg_max(stage, pos) AS stage, arg_max(iterations, pos) AS iterations,
           arg_max(iters_per_s, pos) AS iters_per_s,
           arg_max(tokens_per_s, pos) FILTER (WHERE tokens_per_s IS NOT NULL) AS tokens_per_s
    FROM ordered
    GROUP BY run_id
),
measured AS (
    SELECT r.run_id, r.started,
           CASE WHEN l.tokens_per_s IS NULL THEN 'iterations/s' ELSE 'tokens/s' END AS unit,
           coalesce(l.tokens_per_s, l.iters_per_s) AS throughput
    FROM output AS l
    JOIN runs AS r USING (run_id)
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
