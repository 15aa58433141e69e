-- A handler completes its own task inside its own transaction (the
-- transaction of the handler's database work). Fenced like the outcome
-- writer: only while this attempt still holds the task (claims and claim
-- token), and not once an operator asked to cancel it, unless it is a
-- workflow's step: its success is recorded whatever the cancel, so that
-- its saga compensates it (migration 48). The task moves to
-- the history, unless its uniqueness covers COMPLETED (it stays here,
-- holding its unique key; see complete_tasks.sql). $1 id, $2 claims, $3 claim
-- token, $4 result (JSON text, or null).
WITH task AS (
    SELECT id, coalesce(unique_states & 8, 0) = 0 AS archive
    FROM outbox_tasks
    WHERE id = $1
      AND (claims = $2 AND claimed_by = $3
           -- A task its run holds in place without a write (migration 56).
           OR claims = $2 - 1
           AND outbox_tasks.claimed_by IS NULL AND outbox_tasks.blocked AND outbox_tasks.state = 'pending'
           AND outbox_run_claim(outbox_tasks.queue, outbox_tasks.ordering_key, outbox_tasks.key_seq) = $3)
      AND (cancel_requested_at IS NULL OR workflow_id IS NOT NULL)
    FOR UPDATE
),
gone AS (
    DELETE FROM outbox_tasks AS t
    USING task
    -- t.id = $1 as well: a join alone could be planned as a walk of the
    -- whole table when its statistics were taken while it was empty
    -- (migration 27).
    WHERE t.id = $1 AND t.id = task.id AND task.archive
    RETURNING t.*
),
archived AS (
    INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                     max_attempts, claims, execute_at, created_at, attempted_at,
                                     finished_at, last_error, result, unique_key, ordering_key,
                                     key_seq)
    SELECT id, task_type, queue, payload, priority, retry_count, max_attempts,
           claims + CASE WHEN claimed_by IS NULL THEN 1 ELSE 0 END,
           execute_at, created_at, attempted_at, clock_timestamp(), last_error, $4::jsonb, unique_key,
           ordering_key, key_seq
    FROM gone
),
kept AS (
    UPDATE outbox_tasks AS t
    SET state = 'completed',
        finished_at = clock_timestamp(),
        claims = t.claims + CASE WHEN t.claimed_by IS NULL THEN 1 ELSE 0 END,
        claimed_by = NULL,
        heartbeat_at = NULL,
        result = $4::jsonb,
        updated_at = now()
    FROM task
    WHERE t.id = $1 AND t.id = task.id AND NOT task.archive
    RETURNING t.id, t.queue, t.ordering_key
),
handed AS (
    -- The task lets go of its ordering key and hands it on (after the row
    -- above is written: the aggregate reads it first).
    SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key)) AS n
    FROM (SELECT queue, ordering_key FROM gone
          UNION ALL
          SELECT queue, ordering_key FROM kept) AS k
    WHERE ordering_key IS NOT NULL
    HAVING count(*) > 0
)
SELECT id FROM gone WHERE (SELECT count(*) FROM handed) >= 0
UNION ALL
SELECT id FROM kept
