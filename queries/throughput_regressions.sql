-- Each run of a configuration against the run of the same configuration before
-- it, oldest first: which change cost throughput, and when. A configuration is
-- the value of one tag ($tag_key, e.g. 'config' or 'model'); runs without the
-- tag are left out. Throughput is the run's steady throughput as in
-- runs_by_throughput (tokens/s when one of its stages counts tokens, else
-- iterations/s), compared only with runs measured the same way. A drop of more
-- than $drop_share is a regression (tlog's choice of default: 5%, above the
-- run-to-run noise of a steady loop).
--
-- Parameters:
--   $tag_key VARCHAR: the tag whose value names a configuration.
--   $drop_share DOUBLE = 0.05: a drop below (1 - $drop_share) of the previous run is a regression.
--   $warmup_iters INTEGER = NULL: NULL: tlog diagnose's steady state; N: leave out the first N iterations of each worker instead of its detected warm-up.
--
-- Columns:
--   config VARCHAR: the tag's value.
--   run_id VARCHAR: the run.
--   started_utc TIMESTAMP: when the run started (UTC).
--   unit VARCHAR: 'tokens/s' or 'iterations/s', the unit of the throughput columns.
--   throughput DOUBLE (unit): the run's steady throughput.
--   previous_run_id VARCHAR: the run of the configuration before it (same unit); NULL for the first.
--   previous DOUBLE (unit): that run's throughput.
--   change DOUBLE (share): throughput / previous - 1; negative is slower.
--   regression BOOLEAN: change below -$drop_share.
WITH measured AS (
    SELECT r.tags ->> $tag_key AS config, r.run_id, r.started,
           CASE WHEN l.tokens_per_s IS NULL THEN 'iterations/s' ELSE 'tokens/s' END AS unit,
           coalesce(l.tokens_per_s, l.iters_per_s) AS throughput
    FROM _run_throughput($warmup_iters) AS l
    JOIN runs AS r USING (run_id)
    WHERE r.tags ->> $tag_key IS NOT NULL
),
ordered AS (
    SELECT m.*,
           lag(m.run_id) OVER before AS previous_run_id,
           lag(m.throughput) OVER before AS previous
    FROM measured AS m
    WINDOW before AS (PARTITION BY m.config, m.unit ORDER BY m.started, m.run_id)
)
SELECT config, run_id, make_timestamp((started * 1e6)::BIGINT) AS started_utc, unit,
       throughput, previous_run_id, previous,
       throughput / nullif(previous, 0) - 1 AS change,
       coalesce(throughput / nullif(previous, 0) - 1 < -$drop_share, false) AS regression
FROM ordered
ORDER BY config, started, run_id;
