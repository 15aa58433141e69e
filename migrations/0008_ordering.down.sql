DROP TRIGGER IF EXISTS outbox_key_insert ON outbox_tasks;
DROP FUNCTION IF EXISTS outbox_key_on_insert();
DROP FUNCTION IF EXISTS outbox_keys_advance(text[], text[]);
DROP FUNCTION IF EXISTS outbox_key_advance(text, text);
DROP FUNCTION IF EXISTS outbox_key_full(text, text, bigint);
DROP FUNCTION IF EXISTS outbox_lock_key(text, text);
DROP FUNCTION IF EXISTS outbox_needs_key(outbox_task_state, timestamptz, boolean);
DROP TABLE IF EXISTS outbox_workers;
DROP TABLE IF EXISTS outbox_queues;
DROP TABLE IF EXISTS outbox_keys;
DROP SEQUENCE IF EXISTS outbox_key_seq;
DROP INDEX IF EXISTS outbox_tasks_key_waiting_idx;
DROP INDEX IF EXISTS outbox_tasks_key_holders_idx;
DROP INDEX IF EXISTS outbox_tasks_claimable_idx;
CREATE INDEX outbox_tasks_claimable_idx
    ON outbox_tasks (queue, priority, execute_at, id)
    WHERE state IN ('pending', 'failed') AND dead_at IS NULL;
ALTER TABLE outbox_tasks
    DROP COLUMN IF EXISTS ordering_key,
    DROP COLUMN IF EXISTS key_seq,
    DROP COLUMN IF EXISTS blocked,
    DROP COLUMN IF EXISTS skip_dead,
    DROP COLUMN IF EXISTS attempted_at;
