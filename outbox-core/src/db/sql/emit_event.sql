-- Appends one event to the log (outbox::emit). The aggregate's advisory
-- lock is taken first, so the position drawn after it follows the commits
-- of every earlier emitter of the aggregate. It is the statement's
-- one-time filter: a query without FROM evaluates its WHERE once, before
-- its target list (where the position is drawn), whatever the plan; a
-- function scan in FROM did the same at the price of a tuplestore per
-- emit. The lock's key is the hash a relay's partitions share out
-- (event_read.sql). Class 1869574002 names outbox's event locks among the
-- two-key advisory locks. The transaction's id is taken before the
-- position (the xid column comes first): see the log's xid column.
-- Unordered events go through emit_event_unordered.sql instead. The SQL
-- API's outbox_emit (migration 14) takes the same lock before the same
-- insert as a function scan, this statement's form until stop 49: the
-- same order, one tuplestore more.
INSERT INTO outbox_event_log (xid, id, aggregatetype, aggregateid, type, payload, headers, stream, publish_at)
SELECT pg_current_xact_id(), $1::uuid, $2, $3, $4, $5::jsonb, $6::jsonb, $7, $8::timestamptz
WHERE pg_advisory_xact_lock(1869574002, hashtext($2::text || '/' || $3::text)) IS NOT NULL
RETURNING position
