-- Sends signal $2 with value $3 (JSON text) to task $1, in the caller's
-- transaction; the first signal of a name wins. A task that ran and is
-- pending again (suspended in wait_for or sleep, or snoozed) becomes due
-- now and its queue's workers are woken at commit; one that never ran
-- keeps its run-at. Returns whether it was recorded.
WITH sent AS (
    INSERT INTO outbox_task_signals (task_id, name, value)
    VALUES ($1, $2, $3::jsonb)
    ON CONFLICT (task_id, name) DO NOTHING
    RETURNING task_id
),
woken AS (
    UPDATE outbox_tasks AS t
    SET execute_at = least(t.execute_at, now())
    FROM sent
    WHERE t.id = sent.task_id AND t.state = 'pending' AND t.claims > 0
    RETURNING t.queue
),
told AS (
    SELECT pg_notify('outbox_tasks', queue) FROM woken
)
SELECT EXISTS (SELECT 1 FROM sent) AND (SELECT count(*) FROM told) >= 0
