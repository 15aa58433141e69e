ALTER TABLE outbox_tasks DROP COLUMN IF EXISTS cancel_requested_at;
