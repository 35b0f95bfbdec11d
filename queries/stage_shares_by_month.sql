-- Where each stage's time went, month by month, for each value of one tag:
-- the trend of a configuration's starvation, compute and sync over months.
-- Months are calendar months (UTC) of the runs' start. Shares are
-- time-weighted over the steady iterations of all the month's runs of that tag
-- value (as stage_utilization: each iteration counting max(dur, sum of its
-- top-level phases), so the five shares sum to 1), read from the stored
-- diagnosis. Runs without the tag are left out.
--
-- Parameters:
--   $tag_key VARCHAR: the tag whose values are followed (e.g. 'config').
--
-- Columns:
--   month DATE: the first day of the month (UTC).
--   tag_value VARCHAR: the tag's value.
--   stage VARCHAR: the pipeline stage.
--   runs BIGINT: runs of the month with this tag value and stage.
--   iterations BIGINT: their steady iterations of the stage, all workers.
--   starvation DOUBLE (share): share of the stage's time waiting for input.
--   backpressure DOUBLE (share): share blocked handing output on.
--   compute DOUBLE (share): share doing the work.
--   sync DOUBLE (share): share blocked on the device or other ranks.
--   unaccounted DOUBLE (share): share no phase covers.
WITH tagged AS (
    SELECT run_id, tags ->> $tag_key AS tag_value,
           CAST(date_trunc('month', make_timestamp((started * 1e6)::BIGINT)) AS DATE) AS month
    FROM runs
    WHERE tags ->> $tag_key IS NOT NULL AND started IS NOT NULL
)
SELECT t.month, t.tag_value, a.stage,
       count(DISTINCT a.run_id) AS runs,
       count(*) AS iterations,
       sum(a.starvation_s) / nullif(sum(a.base_s), 0) AS starvation,
       sum(a.backpressure_s) / nullif(sum(a.base_s), 0) AS backpressure,
       sum(a.compute_s) / nullif(sum(a.base_s), 0) AS compute,
       sum(a.sync_s) / nullif(sum(a.base_s), 0) AS sync,
       sum(a.unaccounted_s) / nullif(sum(a.base_s), 0) AS unaccounted
FROM attribution AS a
JOIN tagged AS t USING (run_id)
WHERE a.steady
GROUP BY t.month, t.tag_value, a.stage
ORDER BY t.month, t.tag_value, a.stage;
