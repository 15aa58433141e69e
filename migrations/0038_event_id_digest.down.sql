ALTER TABLE outbox_event_ids DROP COLUMN digest;
