-- Insert one task due now, with no ordering key, into the intake
-- (migration 31): the single submit's row, the narrowest the task can be
-- written as, inside the caller's own transaction. A claim moves it into
-- outbox_tasks. $1 task_type, $2 queue, $3 payload (JSON text), $4
-- priority, $5 max_attempts.
INSERT INTO outbox_intake (task_type, queue, payload, priority, max_attempts)
VALUES ($1, $2, $3::jsonb, $4, $5)
RETURNING id
