-- TX2: write the outcomes of a batch of attempts in one statement.
-- Each outcome is fenced on the claim it belongs to: if the task was
-- recovered and claimed again meanwhile (or the claim was lost in a server
-- crash and the task claimed anew), claims or the claim token has moved on
-- and the stale outcome changes nothing. A task an operator asked to cancel
-- (cancel_requested_at) ends dead whatever the outcome says. A successful
-- task moves to the history with its result, unless its uniqueness covers
-- COMPLETED (it stays here, holding its unique key; see complete_tasks.sql).
-- $1 id bigint[], $2 claims int[], $3 claim token text[], $4 new state
-- text[] ('completed', 'failed' or 'pending'), $5 add to retry_count int[],
-- $6 delay before the next attempt in microseconds bigint[], $7 dead
-- bool[], $8 error text[] (null keeps the previous one). $9 overrides the
-- clock (tests). $10 result text[] (JSON; null keeps none).
-- Returns the ids written, and (with a null id) each ordering key let go of
-- whose row another transaction held for longer than 50 ms: it is handed on
-- by the worker in a statement of its own (migration 23; complete_tasks.sql
-- says why).
WITH batch AS (
    -- Locked first, so that what decides a row's fate is its latest version
    -- and the DELETE and UPDATE below split the batch between them exactly.
    SELECT t.id, o.state, o.add_retry, o.delay_us, o.dead, o.error, o.result,
           t.cancel_requested_at IS NOT NULL AS cancelled,
           o.state = 'completed' AND t.cancel_requested_at IS NULL
               AND coalesce(t.unique_states & 8, 0) = 0 AS archive
    FROM outbox_tasks AS t
    JOIN unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::int[], $6::bigint[],
                $7::bool[], $8::text[], $10::text[])
         AS o(id, claims, token, state, add_retry, delay_us, dead, error, result)
      ON t.id = o.id
    WHERE t.claims = o.claims
      -- The claim token is unique to the claim statement (only PROCESSING rows
      -- have one: a CHECK constraint says so). Testing claimed_by rather than
      -- state keeps the planner from walking outbox_tasks_processing_idx and
      -- re-scanning the batch for every row.
      AND t.claimed_by = o.token
    FOR UPDATE OF t
),
gone AS (
    DELETE FROM outbox_tasks AS t
    USING batch
    WHERE t.id = batch.id AND batch.archive
    RETURNING t.*, batch.result AS new_result
),
archived AS (
    INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                     max_attempts, claims, execute_at, created_at, attempted_at,
                                     finished_at, last_error, result, unique_key, ordering_key,
                                     key_seq)
    SELECT id, task_type, queue, payload, priority, retry_count, max_attempts, claims,
           execute_at, created_at, attempted_at, coalesce($9::timestamptz, clock_timestamp()), last_error,
           new_result::jsonb, unique_key, ordering_key, key_seq
    FROM gone
),
kept AS (
    UPDATE outbox_tasks AS t
    SET state = CASE WHEN o.cancelled THEN 'failed' ELSE o.state::outbox_task_state END,
        retry_count = t.retry_count + o.add_retry,
        execute_at = CASE WHEN o.state = 'completed' OR o.cancelled THEN t.execute_at
                          ELSE coalesce($9::timestamptz, now()) + o.delay_us * interval '1 microsecond' END,
        dead_at = CASE WHEN o.dead OR o.cancelled THEN coalesce($9::timestamptz, clock_timestamp()) END,
        last_error = CASE WHEN o.cancelled THEN 'cancelled by an operator'
                          ELSE coalesce(o.error, t.last_error) END,
        result = CASE WHEN NOT o.cancelled THEN o.result::jsonb END,
        finished_at = CASE WHEN o.state = 'pending' AND NOT o.cancelled THEN NULL
                           ELSE coalesce($9::timestamptz, clock_timestamp()) END,
        claimed_by = NULL,
        heartbeat_at = NULL,
        updated_at = coalesce($9::timestamptz, now())
    FROM batch AS o
    WHERE t.id = o.id AND NOT o.archive
    RETURNING t.id, t.queue, t.ordering_key, t.state, t.dead_at, t.skip_dead
),
keys AS (
    -- Tasks that let go of their ordering key hand it on (after every row
    -- above is written: the aggregate reads them all first), if its row can
    -- be taken soon enough. A task gone to the history has let go of it.
    SELECT l.*
    FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k
          FROM (SELECT queue, ordering_key FROM gone
                UNION ALL
                SELECT queue, ordering_key FROM kept
                WHERE NOT (state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead))) AS k
          WHERE ordering_key IS NOT NULL
          HAVING count(*) > 0) AS released,
         LATERAL outbox_keys_try_lock(released.q, released.k, interval '50 milliseconds') AS l
),
handed AS (
    SELECT count(*) AS n
    FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k
          FROM keys WHERE held
          HAVING count(*) > 0) AS taken,
         LATERAL outbox_keys_hand_on_held(taken.q, taken.k, '{}'::text[], '{}'::int[],
                                          NULL::text, NULL::timestamptz) AS h
)
SELECT id, NULL::text AS queue, NULL::text AS deferred_key
FROM gone WHERE (SELECT count(*) FROM handed) >= 0
UNION ALL
SELECT id, NULL, NULL FROM kept
UNION ALL
SELECT NULL, queue, ordering_key FROM keys WHERE held IS NOT TRUE
