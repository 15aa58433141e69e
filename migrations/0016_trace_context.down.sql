ALTER TABLE outbox_tasks DROP COLUMN trace_context;
