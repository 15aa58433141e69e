-- Appends one unordered event to the log (Event::unordered): as
-- emit_event.sql without the aggregate's lock.
INSERT INTO outbox_event_log (xid, id, aggregatetype, aggregateid, type, payload, headers, stream, publish_at)
VALUES (pg_current_xact_id(), $1::uuid, $2, $3, $4, $5::jsonb, $6::jsonb, $7, $8::timestamptz)
RETURNING position
