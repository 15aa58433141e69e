-- TX1: claim up to $2 claimable tasks of queue $1 under claim token $3 (a
-- value unique to this statement, written to claimed_by), as one
-- short autocommit statement. SKIP LOCKED lets concurrent workers pass over
-- each other's rows instead of queueing behind them. The WHERE clause
-- repeats the predicate of outbox_tasks_claimable_idx word for word.
-- $4 overrides the clock (tests); null means the database's now(), but for
-- attempted_at: clock_timestamp(), the moment of the claim itself, so that
-- recorded attempts never seem to start before the outcome that made room
-- for them (finish_tasks.sql records finished_at the same way).
--
-- The claim commits without waiting for its WAL flush (synchronous_commit
-- off for this statement's transaction only): if the server crashes and
-- loses it, the task is simply still claimable and runs again, which
-- at-least-once delivery allows; the lost claim's token is never reused, so
-- a late outcome of that attempt is fenced out of the new one. Outcomes (TX2) stay fully durable, and
-- their flush also flushes every claim before them.
--
-- This is the claim of a queue without limits: it claims only while the
-- queue's row in outbox_queues says so (not paused, no global concurrency,
-- no rate), and holds that row FOR SHARE meanwhile, so an operator's change
-- waits for it and every later claim sees the change (a queue with limits
-- is claimed by claim_limited.sql). A queue without a row has no limits:
-- workers add the row before they claim.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
),
open AS (
    SELECT 1
    FROM outbox_queues
    WHERE name = $1
      AND paused_at IS NULL AND global_concurrency IS NULL AND rate_per_second IS NULL
    FOR SHARE
),
gate AS (
    SELECT EXISTS (SELECT 1 FROM open)
           OR NOT EXISTS (SELECT 1 FROM outbox_queues WHERE name = $1) AS claimable
),
-- The claim order is (priority, execute_at, id). The producer remembers
-- where its last claim ended, the floor ($5, $6, $7: a position in that
-- order), and this claim looks above it before below it: three ranges of
-- the claimable index that together cover all of it, read one after the
-- other until $2 tasks are found. Why: a task claimed or finished since the
-- oldest open snapshot keeps its entry in the index (its old version is
-- still visible to that snapshot), so a claim that always started at the
-- front would step over every task claimed since a long report query or
-- pg_dump began, and a drain beside one would slow with its square. Above
-- the floor lie only the entries of claims since this producer's last.
--   1. A higher priority than the floor's: never held back by it.
--   2. Above the floor.
--   3. The floor's priority at or below the floor: tasks that became
--      claimable behind it (a late commit, a retry due earlier, a
--      recovered task, a key's next task). Read only when the first two
--      ranges do not fill the claim; the producer also claims with no floor
--      (the lowest position) once its floor is a second old, so no task
--      waits behind a long backlog for more than that.
-- The three ranges are disjoint, so no task is locked twice.
next AS (
    (SELECT id FROM (
     SELECT id
     FROM outbox_tasks
     WHERE queue = $1
       AND state IN ('pending', 'failed') AND dead_at IS NULL AND NOT blocked
       AND execute_at <= coalesce($4::timestamptz, now())
       AND priority < $5
       AND (SELECT claimable FROM gate)
     ORDER BY priority, execute_at, id
     LIMIT $2
     FOR UPDATE SKIP LOCKED) AS r)
    UNION ALL
    (SELECT id FROM (
     SELECT id
     FROM outbox_tasks
     WHERE queue = $1
       AND state IN ('pending', 'failed') AND dead_at IS NULL AND NOT blocked
       AND execute_at <= coalesce($4::timestamptz, now())
       AND (priority, execute_at, id) > ($5, $6, $7)
       AND (SELECT claimable FROM gate)
     ORDER BY priority, execute_at, id
     LIMIT $2
     FOR UPDATE SKIP LOCKED) AS r)
    UNION ALL
    (SELECT id FROM (
     SELECT id
     FROM outbox_tasks
     WHERE queue = $1
       AND state IN ('pending', 'failed') AND dead_at IS NULL AND NOT blocked
       AND execute_at <= coalesce($4::timestamptz, now())
       AND priority = $5 AND (execute_at, id) <= ($6, $7)
       AND (SELECT claimable FROM gate)
     ORDER BY priority, execute_at, id
     LIMIT $2
     FOR UPDATE SKIP LOCKED) AS r)
    LIMIT $2
)
UPDATE outbox_tasks AS t
SET state = 'processing',
    claims = t.claims + 1,
    claimed_by = $3,
    heartbeat_at = coalesce($4::timestamptz, now()),
    attempted_at = coalesce($4::timestamptz, clock_timestamp()),
    updated_at = coalesce($4::timestamptz, now())
FROM next, async_commit
WHERE t.id = next.id
RETURNING t.id, t.task_type, t.queue, t.payload::text AS payload,
          t.retry_count, t.max_attempts, t.claims,
          t.ordering_key IS NOT NULL AS ordered, t.key_seq, t.created_at, t.trace_context,
          t.priority, t.execute_at
