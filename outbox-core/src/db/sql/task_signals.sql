-- The signals sent to task $1 (outbox::signal, `tasks signal`,
-- outbox_signal), in the order they were sent: what `tasks show` lists.
SELECT name, value, sent_at
FROM outbox_task_signals
WHERE task_id = $1
ORDER BY sent_at, name
