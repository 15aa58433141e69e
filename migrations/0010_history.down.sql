-- Back to one table: every history row returns to outbox_tasks as COMPLETED
-- (with its ordering key's place as it was: the insert trigger is held off).
ALTER TABLE outbox_tasks DISABLE TRIGGER outbox_key_insert;
INSERT INTO outbox_tasks (id, task_type, queue, payload, state, priority, retry_count,
                          max_attempts, claims, execute_at, created_at, updated_at,
                          attempted_at, finished_at, last_error, result, unique_key,
                          ordering_key, key_seq)
OVERRIDING SYSTEM VALUE
SELECT id, task_type, queue, payload, 'completed', priority, retry_count, max_attempts, claims,
       execute_at, created_at, finished_at, attempted_at, finished_at, last_error, result,
       unique_key, ordering_key, key_seq
FROM outbox_task_history;
ALTER TABLE outbox_tasks ENABLE TRIGGER outbox_key_insert;
DROP VIEW outbox_all_tasks;
DROP FUNCTION outbox_history_drop(timestamptz);
DROP FUNCTION outbox_history_cover(timestamptz, interval);
DROP FUNCTION outbox_history_partitions();
DROP TABLE outbox_task_history;
