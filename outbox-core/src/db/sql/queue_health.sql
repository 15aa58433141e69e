-- The cheap figures for gauges: each sub-query is answered from a partial
-- index, so the cost does not grow with completed history. Tasks in the
-- intake (migration 31, a few rows long) are claimable.
-- Tasks claimed in a run (migration 28) stay blocked: they count as
-- processing, not as waiting, and so do those held in place (PENDING:
-- claimed, migration 43, or between where their run starts and its last
-- task, migration 56). Each count read once, for both figures.
WITH waiting AS (
    SELECT count(*) FILTER (WHERE claimed_by IS NULL) AS unclaimed,
           count(*) FILTER (WHERE state = 'pending' AND claimed_by IS NOT NULL) AS held
    FROM outbox_tasks WHERE blocked
), unwritten AS (
    SELECT count(*) AS held
    FROM outbox_tasks AS r
    JOIN outbox_tasks AS w
      ON w.queue = r.queue AND w.ordering_key = r.ordering_key AND w.blocked
     AND w.key_seq >= r.run_from AND w.key_seq < r.key_seq
     AND w.state = 'pending' AND w.claimed_by IS NULL
    WHERE r.state = 'processing' AND r.blocked
)
SELECT
    (SELECT count(*) FROM outbox_tasks
      WHERE state IN ('pending', 'failed') AND dead_at IS NULL AND NOT blocked AND execute_at <= now())
      + (SELECT count(*) FROM outbox_intake) AS claimable,
    (SELECT count(*) FROM outbox_tasks
      WHERE state IN ('pending', 'failed') AND dead_at IS NULL AND NOT blocked AND execute_at > now()) AS scheduled,
    (SELECT unclaimed FROM waiting) - (SELECT held FROM unwritten) AS blocked,
    (SELECT count(*) FROM outbox_tasks WHERE state = 'processing')
      + (SELECT held FROM waiting) + (SELECT held FROM unwritten) AS processing,
    (SELECT count(*) FROM outbox_tasks WHERE dead_at IS NOT NULL) AS dead,
    (SELECT coalesce(extract(epoch FROM now() - least(
         (SELECT min(execute_at) FROM outbox_tasks
           WHERE state IN ('pending', 'failed') AND dead_at IS NULL AND NOT blocked
             AND execute_at <= now()),
         (SELECT min(created_at) FROM outbox_intake))), 0)::float8) AS oldest_claimable_age_s,
    (SELECT coalesce(extract(epoch FROM now() - min(heartbeat_at)), 0)::float8 FROM outbox_tasks
      WHERE state = 'processing') AS oldest_heartbeat_age_s
