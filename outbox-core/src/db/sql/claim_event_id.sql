-- Records an event id for emit_once, with a digest of the event's
-- aggregate type $2, aggregate id $3, type $4 and payload $5 (as jsonb's
-- text, so the order of its keys does not count, though the way a number
-- is written does: 1.0 is not 1); no row back when it was
-- recorded before. A concurrent transaction recording the same id makes
-- this wait for its outcome, so of two racing retries exactly one emits.
INSERT INTO outbox_event_ids (id, digest)
VALUES ($1::uuid, md5(concat_ws(chr(31), $2::text, $3::text, $4::text, $5::jsonb::text)))
ON CONFLICT (id) DO NOTHING
RETURNING true
