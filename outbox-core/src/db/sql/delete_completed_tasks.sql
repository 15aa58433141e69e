-- TX2 fast path with a retention of zero: successful tasks are deleted at
-- once instead of being kept as COMPLETED history. Fenced like
-- finish_tasks.sql. A task an operator asked to cancel is kept, dead, as
-- the record of the cancel. $1 id bigint[], $2 claims int[], $3 claim
-- token text[].
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
handed AS (
    -- Every one of them let go of its ordering key (a cancelled task is
    -- skipped): the key goes on, after every row above is written.
    SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key)) AS n
    FROM (SELECT queue, ordering_key FROM gone UNION ALL SELECT queue, ordering_key FROM cancelled) AS k
    WHERE ordering_key IS NOT NULL
    HAVING count(*) > 0
)
SELECT id FROM gone WHERE (SELECT count(*) FROM handed) >= 0
UNION ALL
SELECT id FROM cancelled
