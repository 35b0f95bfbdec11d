-- Throughput and mean iteration time of each stage of one run, over time.
-- In buckets of $bucket_s seconds from the run's first iteration. Every iteration
-- counts (warm-up and event overlaps included), so warm-up, drift and stalls
-- show. An iteration falls in the bucket where it starts. In a bucket, a
-- stage's tokens/s is the sum over its workers of tokens / wall time of their
-- iterations there, its iterations/s the mean over workers (as in
-- stage_utilization). Iterations are those 'tlog diagnose' reads (the
-- attribution table: iterations with impossible values are left out).
--
-- Parameters:
--   $run_id VARCHAR: the run.
--   $bucket_s DOUBLE = 10.0: bucket width in seconds.
--
-- Columns:
--   stage VARCHAR: the pipeline stage.
--   bucket BIGINT: bucket number, 0 for the first.
--   t_start_s DOUBLE (s): bucket start, seconds after the run's first iteration.
--   iterations BIGINT: iterations starting in the bucket, all workers.
--   iter_mean_s DOUBLE (s): mean wall time of those iterations.
--   iters_per_s DOUBLE (iterations/s): mean over workers of iterations / wall time.
--   tokens_per_s DOUBLE (tokens/s): sum over workers of tokens / wall time; NULL without tokens.
WITH its AS (
    SELECT i.*,
           CASE WHEN $bucket_s >= 0.001
                THEN floor((i.ts - min(i.ts) OVER ()) / $bucket_s)::BIGINT
                ELSE error('parameter $bucket_s must be at least 0.001 (seconds)') END AS bucket
    FROM attribution AS i
    WHERE i.run_id = $run_id
),
per_worker AS (
    SELECT stage, rank, worker, bucket, count(*) AS iterations, sum(dur) AS wall_s,
           sum(tokens) AS tokens
    FROM its
    GROUP BY stage, rank, worker, bucket
)
SELECT stage, bucket, bucket * $bucket_s AS t_start_s,
       sum(iterations)::BIGINT AS iterations,
       sum(wall_s) / sum(iterations) AS iter_mean_s,
       avg(iterations / nullif(wall_s, 0)) AS iters_per_s,
       sum(tokens / nullif(wall_s, 0)) AS tokens_per_s
FROM per_worker
GROUP BY stage, bucket
ORDER BY stage, bucket;
