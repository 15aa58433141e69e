-- Records durable step $2 of task $1 with result $3 (JSON text). No row:
-- recorded now. A row: another attempt recorded it first, with this result.
WITH recorded AS (
    INSERT INTO outbox_durable_steps (task_id, name, result)
    VALUES ($1, $2, $3::jsonb)
    ON CONFLICT (task_id, name) DO NOTHING
    RETURNING 1
)
SELECT result::text FROM outbox_durable_steps
WHERE task_id = $1 AND name = $2 AND NOT EXISTS (SELECT 1 FROM recorded)
