-- One bounded batch each: durable step records and signals of tasks that
-- left outbox_tasks (completed into the history, or deleted). A dead task
-- keeps them, so an operator's retry skips what succeeded and still sees
-- its signals; so does a task in the intake (migration 31), signalled
-- before any claim moved it. $1 batch size. Returns the rows deleted.
WITH steps AS (
    DELETE FROM outbox_durable_steps
    WHERE ctid = ANY (ARRAY(
        SELECT d.ctid FROM outbox_durable_steps AS d
        WHERE NOT EXISTS (SELECT 1 FROM outbox_tasks AS t WHERE t.id = d.task_id)
        LIMIT $1))
    RETURNING 1
),
signals AS (
    DELETE FROM outbox_task_signals
    WHERE ctid = ANY (ARRAY(
        SELECT s.ctid FROM outbox_task_signals AS s
        WHERE NOT EXISTS (SELECT 1 FROM outbox_tasks AS t WHERE t.id = s.task_id)
          AND NOT EXISTS (SELECT 1 FROM outbox_intake AS i WHERE i.id = s.task_id)
        LIMIT $1))
    RETURNING 1
)
SELECT (SELECT count(*) FROM steps) + (SELECT count(*) FROM signals)
