-- One bounded batch: durable step records of tasks that left outbox_tasks
-- (completed into the history, or deleted). A dead task keeps its records,
-- so an operator's retry skips what succeeded. $1 batch size.
DELETE FROM outbox_durable_steps
WHERE ctid = ANY (ARRAY(
    SELECT d.ctid FROM outbox_durable_steps AS d
    WHERE NOT EXISTS (SELECT 1 FROM outbox_tasks AS t WHERE t.id = d.task_id)
    LIMIT $1))
