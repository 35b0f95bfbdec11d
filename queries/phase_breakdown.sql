-- Seconds per iteration, category and share of wall time of each phase, per
-- stage of one run. Over steady iterations: the first $warmup_iters of each
-- worker and iterations overlapping an event are left out. Child phases
-- ('forward/mask_build') are listed with their parent; they are counted inside
-- it, so only top-level shares add up (with unaccounted time) to 1.
--
-- Parameters:
--   $run_id VARCHAR: the run.
--   $warmup_iters INTEGER = 10: iterations left out at the start of each worker (warm-up).
--
-- Columns:
--   stage VARCHAR: the pipeline stage.
--   phase VARCHAR: the phase's full name.
--   parent VARCHAR: the parent phase; NULL for a top-level phase.
--   category VARCHAR: starvation, backpressure, compute or sync (host rules).
--   iterations BIGINT: steady iterations of the stage (all workers) that record the phase.
--   seconds_per_iter DOUBLE (s): host seconds in the phase per steady iteration of the stage.
--   gpu_seconds_per_iter DOUBLE (s): device seconds per steady iteration; NULL when not measured.
--   total_s DOUBLE (s): host seconds in the phase, all steady iterations.
--   share DOUBLE (share): total_s over the stage's steady time (each iteration max(dur, top-level phases)).
WITH steady AS (
    SELECT run_id, rank, stage, worker, iter, ts, dur,
           starvation_s + backpressure_s + compute_s + sync_s + unaccounted_s AS base_s
    FROM iteration_positions
    WHERE run_id = $run_id AND pos > $warmup_iters AND NOT in_event
),
stages AS (
    SELECT stage, count(*) AS iterations, sum(base_s) AS wall_s
    FROM steady
    GROUP BY stage
),
per_phase AS (
    SELECT p.stage, p.phase, any_value(p.parent) AS parent, mode(p.category) AS category,
           count(DISTINCT (p.rank, p.worker, p.iter)) AS iterations,
           sum(p.host_s) AS total_s, sum(p.gpu_s) AS gpu_s
    FROM phases AS p
    JOIN steady AS s USING (run_id, rank, stage, worker, iter)
    GROUP BY p.stage, p.phase
),
ranked AS (
    SELECT f.*, max(CASE WHEN f.parent IS NULL THEN f.total_s END)
                    OVER (PARTITION BY f.stage, coalesce(f.parent, f.phase)) AS family_s
    FROM per_phase AS f
)
SELECT f.stage, f.phase, f.parent, f.category, f.iterations,
       coalesce(f.total_s, 0) / s.iterations AS seconds_per_iter,
       f.gpu_s / s.iterations AS gpu_seconds_per_iter,
       coalesce(f.total_s, 0) AS total_s,
       coalesce(f.total_s, 0) / nullif(s.wall_s, 0) AS share
FROM ranked AS f
JOIN stages AS s USING (stage)
ORDER BY f.stage, f.family_s DESC NULLS LAST, coalesce(f.parent, f.phase), f.parent NULLS FIRST,
         f.total_s DESC, f.phase;
