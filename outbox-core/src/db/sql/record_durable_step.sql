-- Records durable step $2 of task $1 with result $3 (JSON text). Returns
-- whether this call recorded it; if not, another attempt did first, and
-- the caller reads theirs with durable_step.sql (a new statement: this
-- one's snapshot may predate their commit).
INSERT INTO outbox_durable_steps (task_id, name, result)
VALUES ($1, $2, $3::jsonb)
ON CONFLICT (task_id, name) DO NOTHING
RETURNING true
