-- outbox: what a handler returned, as JSON (at most 64 KiB, checked by the
-- library before it is written), kept with the completed task.
ALTER TABLE outbox_tasks ADD COLUMN result jsonb;
