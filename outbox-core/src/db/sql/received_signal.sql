-- The value of signal $2 sent to task $1, if any.
SELECT value::text FROM outbox_task_signals WHERE task_id = $1 AND name = $2
