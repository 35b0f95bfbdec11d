-- How full each queue of one run was when sampled. A queue between stages
-- that is almost always empty means its consumer starves on the producer; one
-- almost always full means the producer is held back by the consumer
-- (backpressure). Samples overlapping an event are kept: this is the whole run.
--
-- Parameters:
--   $run_id VARCHAR: the run.
--
-- Columns:
--   name VARCHAR: the queue.
--   samples BIGINT: depth samples, all ranks together.
--   capacity BIGINT: the largest capacity reported; NULL when never reported.
--   mean_depth DOUBLE (items): mean sampled depth.
--   max_depth BIGINT (items): largest sampled depth.
--   empty_share DOUBLE (share): share of samples with depth 0.
--   full_share DOUBLE (share): share of samples with depth at or above capacity; NULL without capacity.
SELECT name,
       count(*) AS samples,
       max(capacity) AS capacity,
       avg(depth) AS mean_depth,
       max(depth) AS max_depth,
       avg(CASE WHEN depth = 0 THEN 1.0 ELSE 0.0 END) AS empty_share,
       avg(CASE WHEN capacity IS NULL THEN NULL WHEN depth >= capacity THEN 1.0 ELSE 0.0 END) AS full_share
FROM queue_samples
WHERE run_id = $run_id
GROUP BY name
ORDER BY name;
