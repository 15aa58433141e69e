-- Operator overview, one row per queue. Every part reads a partial index
-- or the small per-minute table, never the completed history:
-- live tasks from outbox_tasks_claimable_idx, those waiting for their
-- ordering key from outbox_tasks_key_waiting_idx, running ones from
-- outbox_tasks_processing_idx, dead ones from outbox_tasks_dead_queue_idx,
-- the last hour's outcomes from outbox_throughput.
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE execute_at <= now()) AS available,
           count(*) FILTER (WHERE execute_at > now() AND state = 'pending') AS scheduled,
           count(*) FILTER (WHERE execute_at > now() AND state = 'failed') AS retrying,
           coalesce(extract(epoch FROM now() - min(execute_at) FILTER (WHERE execute_at <= now())), 0)::float8 AS oldest
    FROM (SELECT queue, execute_at, state FROM outbox_tasks
          WHERE state IN ('pending', 'failed') AND dead_at IS NULL AND NOT blocked
          UNION ALL
          -- The intake's tasks (migration 31), due since their submit.
          SELECT queue, created_at, 'pending' FROM outbox_intake) AS t
    GROUP BY queue
), waiting AS (
    -- The tasks of a run held in place are blocked and PENDING but
    -- claimed: they count as processing. Held under the claim (migration
    -- 43), or without a write (migration 56): from where the run starts
    -- to its last task, which is blocked and PROCESSING.
    SELECT b.queue, count(*) AS blocked,
           count(*) FILTER (WHERE b.state = 'pending' AND b.claimed_by IS NOT NULL) AS held
    FROM outbox_tasks AS b WHERE b.blocked
    GROUP BY b.queue
), unwritten AS (
    SELECT r.queue, count(*) AS held
    FROM outbox_tasks AS r
    JOIN outbox_tasks AS w
      ON w.queue = r.queue AND w.ordering_key = r.ordering_key AND w.blocked
     AND w.key_seq >= r.run_from AND w.key_seq < r.key_seq
     AND w.state = 'pending' AND w.claimed_by IS NULL
    WHERE r.state = 'processing' AND r.blocked
    GROUP BY r.queue
), running AS (
    -- Tasks claimed in a run (migration 28) stay blocked: they count as
    -- processing, not as waiting.
    SELECT queue, count(*) AS processing, count(*) FILTER (WHERE blocked) AS in_runs
    FROM outbox_tasks WHERE state = 'processing'
    GROUP BY queue
), dead AS (
    SELECT queue, count(*) AS dead
    FROM outbox_tasks WHERE dead_at IS NOT NULL
    GROUP BY queue
), hour AS (
    SELECT queue, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed
    FROM outbox_throughput WHERE minute > now() - interval '1 hour'
    GROUP BY queue
), queues AS (
    SELECT queue FROM live UNION SELECT queue FROM waiting UNION SELECT queue FROM running
    UNION SELECT queue FROM dead UNION SELECT queue FROM hour
)
SELECT q.queue,
       coalesce(l.available, 0) AS available,
       coalesce(l.scheduled, 0) AS scheduled,
       coalesce(l.retrying, 0) AS retrying,
       coalesce(w.blocked, 0) - coalesce(r.in_runs, 0) - coalesce(w.held, 0)
           - coalesce(u.held, 0) AS blocked,
       coalesce(r.processing, 0) + coalesce(w.held, 0) + coalesce(u.held, 0) AS processing,
       coalesce(d.dead, 0) AS dead,
       coalesce(h.completed, 0) AS completed_last_hour,
       coalesce(h.failed, 0) AS failed_last_hour,
       coalesce(l.oldest, 0) AS oldest_available_age_s
FROM queues q
LEFT JOIN live l USING (queue)
LEFT JOIN waiting w USING (queue)
LEFT JOIN unwritten u USING (queue)
LEFT JOIN running r USING (queue)
LEFT JOIN dead d USING (queue)
LEFT JOIN hour h USING (queue)
ORDER BY q.queue
