-- Steady throughput of each stage of one run and where its wall time goes.
-- The figures of 'tlog diagnose' (its stages), read from the stored diagnosis
-- (the attribution table): categories after the device-backlog walk and the
-- collective split; steady iterations as diagnose judges them (detected
-- warm-up, event overlaps, attempts of a restarted stage not judged), or, with
-- $warmup_iters, all but the first $warmup_iters of each worker and those.
-- Shares are time-weighted (sums of seconds over all the stage's workers) of
-- the stage's time, each iteration counting max(dur, sum of its top-level
-- phases), so they sum to 1.
--
-- Parameters:
--   $run_id VARCHAR: the run.
--   $warmup_iters INTEGER = NULL: NULL: tlog diagnose's steady state; N: leave out the first N iterations of each worker instead of its detected warm-up.
--
-- Columns:
--   stage VARCHAR: the pipeline stage.
--   workers BIGINT: workers (rank, worker) of the stage with steady iterations.
--   iterations BIGINT: steady iterations, all workers together.
--   wall_s DOUBLE (s): sum of the steady iterations' wall time (dur).
--   iters_per_s DOUBLE (iterations/s): mean over workers of iterations / wall time (a loop's it/s).
--   tokens_per_s DOUBLE (tokens/s): sum over workers of tokens / wall time; NULL without tokens.
--   starvation DOUBLE (share): share of the stage's time waiting for input.
--   backpressure DOUBLE (share): share of the stage's time blocked handing output on.
--   compute DOUBLE (share): share of the stage's time doing the work.
--   sync DOUBLE (share): share of the stage's time blocked on the device or other ranks.
--   unaccounted DOUBLE (share): share of the stage's time no phase covers.
WITH steady AS (
    SELECT *
    FROM attribution
    WHERE run_id = $run_id
      AND CASE WHEN $warmup_iters IS NULL THEN steady
                ELSE pos > $warmup_iters AND NOT in_event AND NOT attempt END
),
per_worker AS (
    SELECT stage, rank, worker, count(*) AS iterations, sum(dur) AS wall_s,
           sum(tokens) AS tokens,
           sum(base_s) AS base_s,
           sum(starvation_s) AS starvation_s, sum(backpressure_s) AS backpressure_s,
           sum(compute_s) AS compute_s, sum(sync_s) AS sync_s, sum(unaccounted_s) AS unaccounted_s
    FROM steady
    GROUP BY stage, rank, worker
)
SELECT stage,
       count(*) AS workers,
       sum(iterations)::BIGINT AS iterations,
       sum(wall_s) AS wall_s,
       avg(iterations / nullif(wall_s, 0)) AS iters_per_s,
       sum(tokens / nullif(wall_s, 0)) AS tokens_per_s,
       sum(starvation_s) / nullif(sum(base_s), 0) AS starvation,
       sum(backpressure_s) / nullif(sum(base_s), 0) AS backpressure,
       sum(compute_s) / nullif(sum(base_s), 0) AS compute,
       sum(sync_s) / nullif(sum(base_s), 0) AS sync,
       sum(unaccounted_s) / nullif(sum(base_s), 0) AS unaccounted
FROM per_worker
GROUP BY stage
ORDER BY stage;
