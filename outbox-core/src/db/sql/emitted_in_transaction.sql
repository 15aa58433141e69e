-- The events the current transaction emitted (outbox::testing::emitted),
-- in log order. The log has no index on xid, so this scans it: a helper
-- for tests, not for production code.
SELECT id::text AS id, position, aggregatetype, aggregateid, type, payload, headers, stream,
       publish_at
FROM outbox_event_log
WHERE xid = pg_current_xact_id()
ORDER BY position
