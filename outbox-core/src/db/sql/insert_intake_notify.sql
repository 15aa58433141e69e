-- insert_intake.sql, and a NOTIFY of the task's queue (delivered at
-- commit; see wakeup.rs). $1 task_type, $2 queue, $3 payload (JSON text),
-- $4 priority, $5 max_attempts.
WITH inserted AS (
    INSERT INTO outbox_intake (task_type, queue, payload, priority, max_attempts)
    VALUES ($1, $2, $3::jsonb, $4, $5)
    RETURNING id
)
SELECT id FROM inserted, (SELECT pg_notify('outbox_tasks', $2)) AS notified
