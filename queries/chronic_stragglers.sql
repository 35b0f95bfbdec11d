-- Hosts that 'tlog diagnose' named straggler in a share of the runs they took
-- part in: a chronic straggler (the same machine slow job after job: a bad
-- GPU, a throttled host, a slow link) against a one-off. A host took part in
-- a run when one of its workers (workers.host; without a recorded host, the
-- rank stands in as 'rank N') has an iteration in the run's stored diagnosis;
-- it was named when the run's diagnosis lists one of its workers among the
-- stragglers (the stored 'tlog diagnose --json', attribution_runs.diagnosis).
-- Only diagnosed runs count. Most often named first.
--
-- Parameters:
--   $min_runs INTEGER = 1: leave out hosts that took part in fewer diagnosed runs.
--   $min_share DOUBLE = 0.0: leave out hosts named in a smaller share of their runs.
--
-- Columns:
--   host VARCHAR: the host ('rank N' where the run recorded no host).
--   runs BIGINT: diagnosed runs the host took part in.
--   straggler_runs BIGINT: of those, the runs whose diagnosis names one of its workers a straggler.
--   share DOUBLE (share): straggler_runs / runs.
--   max_slowdown DOUBLE (ratio): the largest slowdown diagnose gave one of its workers; NULL when never named.
WITH diagnosed AS (
    SELECT run_id, diagnosis FROM attribution_runs WHERE diagnosis IS NOT NULL
),
hosts AS (
    SELECT run_id, rank, stage, worker, max(host) AS host
    FROM workers
    GROUP BY run_id, rank, stage, worker
),
took_part AS (
    SELECT DISTINCT a.run_id, a.stage, a.rank, a.worker,
           coalesce(h.host, 'rank ' || CAST(a.rank AS VARCHAR)) AS host
    FROM attribution AS a
    JOIN diagnosed AS d ON d.run_id = a.run_id
    LEFT JOIN hosts AS h
           ON h.run_id = a.run_id AND h.rank = a.rank AND h.stage = a.stage
          AND h.worker = a.worker
),
named AS (
    SELECT x.run_id, x.s.stage AS stage, x.s.rank AS rank, x.s.worker AS worker,
           x.s.slowdown AS slowdown
    FROM (SELECT run_id,
                 unnest(from_json(json_extract(diagnosis, '$.stragglers'),
                                  '[{"stage": "VARCHAR", "rank": "INTEGER", "worker": "VARCHAR", "slowdown": "DOUBLE"}]'))
                 AS s
          FROM diagnosed) AS x
),
per_host AS (
    SELECT t.host, count(DISTINCT t.run_id) AS runs, count(DISTINCT n.run_id) AS straggler_runs,
           max(n.slowdown) AS max_slowdown
    FROM took_part AS t
    LEFT JOIN named AS n
           ON n.run_id = t.run_id AND n.stage = t.stage AND n.rank = t.rank
          AND n.worker = t.worker
    GROUP BY t.host
)
SELECT host, runs, straggler_runs, straggler_runs / runs AS share, max_slowdown
FROM per_host
WHERE runs >= $min_runs AND straggler_runs / runs >= $min_share
ORDER BY share DESC, straggler_runs DESC, host;
