-- TX2: write the outcomes of a batch of attempts in one statement.
-- Each outcome is fenced on the claim it belongs to: if the task was
-- recovered and claimed again meanwhile (or the claim was lost in a server
-- crash and the task claimed anew), claims or the claim token has moved on
-- and the stale outcome changes nothing. A task an operator asked to cancel
-- (cancel_requested_at) ends dead whatever the outcome says.
-- $1 id bigint[], $2 claims int[], $3 claim token text[], $4 new state
-- text[] ('completed', 'failed' or 'pending'), $5 add to retry_count int[],
-- $6 delay before the next attempt in microseconds bigint[], $7 dead
-- bool[], $8 error text[] (null keeps the previous one). $9 overrides the
-- clock (tests). $10 result text[] (JSON; null keeps none).
WITH done AS (
    UPDATE outbox_tasks AS t
    SET state = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'failed'
                     ELSE o.state::outbox_task_state END,
        retry_count = t.retry_count + o.add_retry,
        execute_at = CASE WHEN o.state = 'completed' OR t.cancel_requested_at IS NOT NULL THEN t.execute_at
                          ELSE coalesce($9::timestamptz, now()) + o.delay_us * interval '1 microsecond' END,
        dead_at = CASE WHEN o.dead OR t.cancel_requested_at IS NOT NULL THEN coalesce($9::timestamptz, now()) END,
        last_error = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'cancelled by an operator'
                          ELSE coalesce(o.error, t.last_error) END,
        result = CASE WHEN t.cancel_requested_at IS NULL THEN o.result::jsonb END,
        finished_at = CASE WHEN o.state = 'pending' AND t.cancel_requested_at IS NULL THEN NULL
                           ELSE coalesce($9::timestamptz, now()) END,
        claimed_by = NULL,
        heartbeat_at = NULL,
        updated_at = coalesce($9::timestamptz, now())
    FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::int[], $6::bigint[],
                $7::bool[], $8::text[], $10::text[])
         AS o(id, claims, token, state, add_retry, delay_us, dead, error, result)
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
