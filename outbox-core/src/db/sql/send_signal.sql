-- Sends signal $2 with value $3 (JSON text) to task $1, in the caller's
-- transaction; the first signal of a name wins. A task that ran and is
-- pending again (suspended in wait_for or sleep, or snoozed) becomes due
-- now and its queue's workers are woken at commit; one that never ran
-- keeps its run-at. Returns whether it was recorded: not when the task has
-- finished (completed, or gone from outbox_tasks) or does not exist, since
-- nothing would read it and maintenance deletes the signals of tasks that
-- left (prune_durable_steps.sql). A dead task takes signals, for a retry.
-- A task in the intake (migration 31) takes them where it is: it has not
-- run, so there is nothing to wake, and it is not moved here, which in a
-- caller's REPEATABLE READ transaction could fail on a claim's move.
WITH sent AS (
    INSERT INTO outbox_task_signals (task_id, name, value)
    SELECT $1, $2, $3::jsonb
    WHERE EXISTS (SELECT 1 FROM outbox_tasks AS t WHERE t.id = $1 AND t.state <> 'completed')
       OR EXISTS (SELECT 1 FROM outbox_intake AS i WHERE i.id = $1)
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
