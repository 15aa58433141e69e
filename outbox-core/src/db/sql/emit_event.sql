-- Appends one event to the log (outbox::emit). The aggregate's advisory
-- lock ($9: unless unordered) is taken first, in the materialised CTE that
-- the insert reads, so the position drawn after it follows the commits of
-- every earlier emitter of the aggregate; the lock's key is the same hash
-- as the log's aggregate_hash column. Class 1869574002 names outbox's
-- event locks among the two-key advisory locks.
WITH x AS MATERIALIZED (
    -- The transaction's id before the position: see the log's xid column.
    SELECT pg_current_xact_id() AS xid
), l AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(1869574002, hashtext($2::text || '/' || $3::text)) WHERE $9::boolean
)
INSERT INTO outbox_event_log (xid, id, aggregatetype, aggregateid, type, payload, headers, stream, publish_at)
SELECT x.xid, $1::uuid, $2, $3, $4, $5::jsonb, $6::jsonb, $7, $8::timestamptz
FROM x, (SELECT count(*) FROM l) AS locked
RETURNING position
