-- A handler completes its own task inside its own transaction (the
-- transaction of the handler's database work). Fenced like the outcome
-- writer: only while this attempt still holds the task (claims and claim
-- token), and not once an operator asked to cancel it. $1 id, $2 claims,
-- $3 claim token, $4 result (JSON text, or null).
WITH done AS (
    UPDATE outbox_tasks
    SET state = 'completed',
        finished_at = now(),
        claimed_by = NULL,
        heartbeat_at = NULL,
        result = $4::jsonb,
        updated_at = now()
    WHERE id = $1
      AND claims = $2
      AND claimed_by = $3
      AND cancel_requested_at IS NULL
    RETURNING id, queue, ordering_key, state, dead_at, skip_dead
),
handed AS (
    -- Tasks that let go of their ordering key hand it on (after every row
    -- above is written: the aggregate reads them all first).
    SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key)) AS n
    FROM done
    WHERE ordering_key IS NOT NULL
      AND NOT (state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead))
    HAVING count(*) > 0
)
SELECT id FROM done WHERE (SELECT count(*) FROM handed) >= 0
