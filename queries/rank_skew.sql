-- Each worker's median compute and wait time per iteration, and its compute
-- skew against its stage peers (one run). Skew is how much slower the worker
-- computes than the median of its peers in the same stage, over steady iterations. Collective and sync waits are left out of the
-- comparison: an all-reduce evens them out across ranks, so a straggler shows
-- in compute, and its peers show the matching extra sync time. A skew of 1.25
-- means 25% more compute per iteration than the peers' median; 'tlog diagnose'
-- judges stragglers from this with its own threshold. Compute and sync as
-- 'tlog diagnose' attributes them (the stored attribution table: device-backlog
-- walk, collective waits carved into sync); steady iterations as diagnose
-- judges them unless $warmup_iters is given.
--
-- Parameters:
--   $run_id VARCHAR: the run.
--   $warmup_iters INTEGER = NULL: NULL: tlog diagnose's steady state; N: leave out the first N iterations of each worker instead of its detected warm-up.
--
-- Columns:
--   stage VARCHAR: the pipeline stage.
--   rank INTEGER: the worker's rank.
--   worker VARCHAR: the worker.
--   iterations BIGINT: steady iterations of the worker.
--   iter_median_s DOUBLE (s): median wall time per iteration.
--   compute_median_s DOUBLE (s): median own work per iteration: compute plus time in no phase (as diagnose's stragglers).
--   starvation_median_s DOUBLE (s): median starvation time per iteration.
--   sync_median_s DOUBLE (s): median sync time per iteration.
--   peers_compute_median_s DOUBLE (s): median of the other workers' compute_median_s; NULL when alone.
--   skew DOUBLE (ratio): compute_median_s / peers_compute_median_s; NULL when alone.
WITH steady AS (
    SELECT *
    FROM attribution
    WHERE run_id = $run_id
      AND CASE WHEN $warmup_iters IS NULL THEN steady
                ELSE pos > $warmup_iters AND NOT in_event AND NOT attempt END
),
per_worker AS (
    SELECT stage, rank, worker, count(*) AS iterations,
           median(dur) AS iter_median_s,
           median(compute_s + unaccounted_s) AS compute_median_s,
           median(starvation_s) AS starvation_median_s, median(sync_s) AS sync_median_s
    FROM steady
    GROUP BY stage, rank, worker
)
SELECT a.stage, a.rank, a.worker, a.iterations, a.iter_median_s, a.compute_median_s,
       a.starvation_median_s, a.sync_median_s,
       median(b.compute_median_s) AS peers_compute_median_s,
       a.compute_median_s / nullif(median(b.compute_median_s), 0) AS skew
FROM per_worker AS a
LEFT JOIN per_worker AS b
       ON b.stage = a.stage AND (b.rank, b.worker) <> (a.rank, a.worker)
GROUP BY a.stage, a.rank, a.worker, a.iterations, a.iter_median_s, a.compute_median_s,
         a.starvation_median_s, a.sync_median_s
ORDER BY a.stage, skew DESC NULLS LAST, a.rank, a.worker;
