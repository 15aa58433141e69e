-- Records an event id for emit_once, with the digest of the event's
-- aggregate type $2, aggregate id $3, type $4 and payload $5
-- (outbox_event_digest, migration 40); no row back when it was recorded
-- before. A concurrent transaction recording the same id makes
-- this wait for its outcome, so of two racing retries exactly one emits.
INSERT INTO outbox_event_ids (id, digest)
VALUES ($1::uuid, outbox_event_digest($2::text, $3::text, $4::text, $5::jsonb))
ON CONFLICT (id) DO NOTHING
RETURNING true
