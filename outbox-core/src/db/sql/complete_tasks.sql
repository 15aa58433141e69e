-- TX2 fast path: the usual outcome, success, for a batch of attempts, with
-- only ids and claims to send. Fenced like finish_tasks.sql.
-- $1 id bigint[], $2 claims int[], $3 claim token text[], $4 clock
-- override (tests).
WITH done AS (
    UPDATE outbox_tasks AS t
    SET state = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'failed' ELSE 'completed' END::outbox_task_state,
        -- An operator asked to cancel it: it ends dead, whatever it returned.
        dead_at = CASE WHEN t.cancel_requested_at IS NOT NULL THEN coalesce($4::timestamptz, now()) END,
        last_error = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'cancelled by an operator'
                          ELSE t.last_error END,
        finished_at = coalesce($4::timestamptz, now()),
        claimed_by = NULL,
        heartbeat_at = NULL,
        updated_at = coalesce($4::timestamptz, now())
    FROM unnest($1::bigint[], $2::int[], $3::text[]) AS o(id, claims, token)
    WHERE t.id = o.id
      AND t.claims = o.claims
      -- The claim token is unique to the claim statement (only PROCESSING rows
      -- have one: a CHECK constraint says so). Testing claimed_by rather than
      -- state keeps the planner from walking outbox_tasks_processing_idx and
      -- re-scanning the batch for every row.
      AND t.claimed_by = o.token
    RETURNING t.id, t.queue, t.ordering_key, t.state, t.dead_at, t.skip_dead
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
