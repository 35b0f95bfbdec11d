-- Seconds per iteration, category and share of wall time of each phase, per
-- stage of one run, as 'tlog diagnose' attributes them (the stored
-- attribution_phases table: after the device-backlog walk and the collective
-- split, so a sync phase's drained part shows as compute on the phases whose
-- device work it waited for), over diagnose's steady iterations. With
-- $warmup_iters given (all but the first $warmup_iters of each worker, and
-- not event overlaps), the per-phase split is not stored: phases then carry
-- their host seconds by the host rules. Child phases ('forward/mask_build')
-- are listed with their parent; they are counted inside it, so only top-level
-- shares add up (with unaccounted time) to 1.
--
-- Parameters:
--   $run_id VARCHAR: the run.
--   $warmup_iters INTEGER = NULL: NULL: tlog diagnose's steady state; N: leave out the first N iterations of each worker instead of its detected warm-up.
--
-- Columns:
--   stage VARCHAR: the pipeline stage.
--   phase VARCHAR: the phase's full name.
--   parent VARCHAR: the parent phase; NULL for a top-level phase.
--   category VARCHAR: starvation, backpressure, compute or sync (host rules; the one with most host seconds).
--   iterations BIGINT: steady iterations of the stage (all workers) that record the phase.
--   seconds_per_iter DOUBLE (s): attributed seconds in the phase per steady iteration of the stage.
--   gpu_seconds_per_iter DOUBLE (s): device seconds per steady iteration; NULL when not measured.
--   total_s DOUBLE (s): attributed seconds in the phase, all steady iterations.
--   share DOUBLE (share): total_s over the stage's steady time (each iteration max(dur, top-level phases)).
WITH steady AS (
    SELECT run_id, rank, stage, worker, iter, base_s
    FROM attribution
    WHERE run_id = $run_id
      AND CASE WHEN $warmup_iters IS NULL THEN steady
               ELSE pos > $warmup_iters AND NOT in_event AND NOT attempt END
),
stages AS (
    SELECT stage, count(*) AS iterations, sum(base_s) AS wall_s
    FROM steady
    GROUP BY stage
),
stored AS (  -- diagnose's steady state: the stored per-phase attribution
    SELECT stage, phase, any_value(parent) AS parent, category,
           sum(iterations) AS iterations, sum(attributed_s) AS total_s, sum(host_s) AS host_s,
           sum(gpu_s) AS gpu_s
    FROM attribution_phases
    WHERE run_id = $run_id AND $warmup_iters IS NULL
    GROUP BY stage, phase, category
),
by_count AS (  -- a fixed warm-up count: host seconds of the phases view
    SELECT p.stage, p.phase, any_value(p.parent) AS parent, p.category,
           count(DISTINCT (p.rank, p.worker, p.iter)) AS iterations,
           sum(p.host_s) AS total_s, sum(p.host_s) AS host_s, sum(p.gpu_s) AS gpu_s
    FROM phases AS p
    JOIN steady AS s USING (run_id, rank, stage, worker, iter)
    WHERE $warmup_iters IS NOT NULL
    GROUP BY p.stage, p.phase, p.category
),
per_phase AS (
    SELECT stage, phase, any_value(parent) AS parent, arg_max(category, host_s) AS category,
           sum(iterations)::BIGINT AS iterations, sum(total_s) AS total_s, sum(gpu_s) AS gpu_s
    FROM (SELECT * FROM stored UNION ALL SELECT * FROM by_count)
    GROUP BY stage, phase
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
