DROP INDEX IF EXISTS outbox_tasks_unique_idx;
DROP FUNCTION IF EXISTS outbox_unique_covers(smallint, outbox_task_state, boolean);
ALTER TABLE outbox_tasks DROP COLUMN IF EXISTS unique_states;
ALTER TABLE outbox_tasks DROP COLUMN IF EXISTS unique_key;
