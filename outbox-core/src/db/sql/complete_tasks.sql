-- TX2 fast path: the usual outcome, success, for a batch of attempts, with
-- only ids and claims to send. Fenced like finish_tasks.sql. A successful
-- task leaves outbox_tasks for the history (migration 10 says why); a task
-- an operator asked to cancel ends dead instead, and one whose uniqueness
-- covers COMPLETED stays here, completed, holding its unique key.
-- $1 id bigint[], $2 claims int[], $3 claim token text[], $4 clock
-- override (tests).
--
-- A key let go of may go straight on to its next task, claimed here for
-- this worker (migration 17 says when): $5 the queues with free places
-- text[], $6 how many in each int[], $7 the claim token of that hand-on
-- (null: none). Rows with handed false are the outcomes written; rows with
-- handed true are tasks handed their key, claimed says whether for us.
-- A key is waited for 50 ms at most: a key that another transaction holds
-- for longer (an application's open submit of the key, say) is not handed
-- on here but returned in deferred_key (with its queue), and the worker
-- hands it on in a statement of its own (migration 23).
WITH batch AS (
    -- Locked first, so that what decides a row's fate is its latest version
    -- (a cancel committed meanwhile is seen), and the DELETE and UPDATE
    -- below split the batch between them exactly.
    SELECT t.id,
           t.cancel_requested_at IS NOT NULL AS cancelled,
           coalesce(t.unique_states & 8, 0) <> 0 AS covers_completed
    FROM outbox_tasks AS t
    JOIN unnest($1::bigint[], $2::int[], $3::text[]) AS o(id, claims, token)
      ON t.id = o.id
    WHERE t.claims = o.claims
      -- The claim token is unique to the claim statement (only PROCESSING
      -- rows have one: a CHECK constraint says so). Testing claimed_by rather
      -- than state keeps the planner from walking outbox_tasks_processing_idx
      -- and re-scanning the batch for every row.
      AND t.claimed_by = o.token
    FOR UPDATE OF t
),
gone AS (
    DELETE FROM outbox_tasks AS t
    USING batch
    WHERE t.id = batch.id AND NOT batch.cancelled AND NOT batch.covers_completed
    RETURNING t.*
),
archived AS (
    INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                     max_attempts, claims, execute_at, created_at, attempted_at,
                                     finished_at, last_error, result, unique_key, ordering_key,
                                     key_seq)
    SELECT id, task_type, queue, payload, priority, retry_count, max_attempts, claims,
           execute_at, created_at, attempted_at, coalesce($4::timestamptz, clock_timestamp()), last_error,
           NULL, unique_key, ordering_key, key_seq
    FROM gone
),
kept AS (
    UPDATE outbox_tasks AS t
    SET state = CASE WHEN batch.cancelled THEN 'failed' ELSE 'completed' END::outbox_task_state,
        -- An operator asked to cancel it: it ends dead, whatever it returned.
        dead_at = CASE WHEN batch.cancelled THEN coalesce($4::timestamptz, clock_timestamp()) END,
        last_error = CASE WHEN batch.cancelled THEN 'cancelled by an operator' ELSE t.last_error END,
        finished_at = coalesce($4::timestamptz, clock_timestamp()),
        claimed_by = NULL,
        heartbeat_at = NULL,
        updated_at = coalesce($4::timestamptz, now())
    FROM batch
    WHERE t.id = batch.id AND (batch.cancelled OR batch.covers_completed)
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
    SELECT h.*
    FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k
          FROM keys WHERE held
          HAVING count(*) > 0) AS taken,
         LATERAL outbox_keys_hand_on_held(taken.q, taken.k, $5::text[], $6::int[], $7::text,
                                          $4::timestamptz) AS h
)
SELECT id, false AS handed, NULL::bool AS claimed, NULL::text AS queue, NULL::text AS task_type,
       NULL::text AS payload, NULL::int AS retry_count, NULL::int AS max_attempts,
       NULL::int AS claims, NULL::bigint AS key_seq, NULL::timestamptz AS created_at,
       NULL::text AS trace_context, NULL::bool AS ordered, NULL::bigint AS workflow_id,
       NULL::text AS deferred_key
FROM gone
UNION ALL
SELECT id, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM kept
UNION ALL
SELECT id, true, claimed, queue, task_type, payload, retry_count, max_attempts, claims, key_seq,
       created_at, trace_context, true, NULL, NULL
FROM handed
UNION ALL
SELECT NULL, true, false, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       ordering_key
FROM keys WHERE held IS NOT TRUE
