-- TX2 fast path with a retention of zero: successful tasks are deleted at
-- once instead of being kept as COMPLETED history. Fenced like
-- finish_tasks.sql. A task an operator asked to cancel is kept, dead, as
-- the record of the cancel. $1 id bigint[], $2 claims int[], $3 claim
-- token text[], $4 clock override (tests; for the hand-on only). $5-$7 and
-- the rows returned: the hand-on, as in complete_tasks.sql.
WITH batch AS (
    SELECT t.id, t.cancel_requested_at IS NOT NULL AS cancelled
    FROM outbox_tasks AS t
    JOIN unnest($1::bigint[], $2::int[], $3::text[]) AS o(id, claims, token)
      ON t.id = o.id
    WHERE t.claims = o.claims
      -- The claim token is unique to the claim statement (only PROCESSING
      -- rows have one: a CHECK constraint says so).
      AND t.claimed_by = o.token
    FOR UPDATE OF t
),
gone AS (
    DELETE FROM outbox_tasks AS t
    USING batch
    WHERE t.id = batch.id AND NOT batch.cancelled
    RETURNING t.id, t.queue, t.ordering_key
),
cancelled AS (
    UPDATE outbox_tasks AS t
    SET state = 'failed',
        dead_at = now(),
        finished_at = now(),
        last_error = 'cancelled by an operator',
        claimed_by = NULL,
        heartbeat_at = NULL,
        updated_at = now()
    FROM batch
    WHERE t.id = batch.id AND batch.cancelled
    RETURNING t.id, t.queue, t.ordering_key
),
keys AS (
    -- Every one of them let go of its ordering key (a cancelled task is
    -- skipped): the key goes on, after every row above is written, if its
    -- row can be taken soon enough (as in complete_tasks.sql).
    SELECT l.*
    FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k
          FROM (SELECT queue, ordering_key FROM gone
                UNION ALL
                SELECT queue, ordering_key FROM cancelled) AS k
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
FROM cancelled
UNION ALL
SELECT id, true, claimed, queue, task_type, payload, retry_count, max_attempts, claims, key_seq,
       created_at, trace_context, true, NULL, NULL
FROM handed
UNION ALL
SELECT NULL, true, false, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       ordering_key
FROM keys WHERE held IS NOT TRUE
