-- The recorded result of durable step $2 of task $1, if any.
SELECT result::text FROM outbox_durable_steps WHERE task_id = $1 AND name = $2
