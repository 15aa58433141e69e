-- Records an event id for emit_once; no row back when it was recorded
-- before. A concurrent transaction recording the same id makes this wait
-- for its outcome, so of two racing retries exactly one emits.
INSERT INTO outbox_event_ids (id) VALUES ($1::uuid)
ON CONFLICT (id) DO NOTHING
RETURNING true
