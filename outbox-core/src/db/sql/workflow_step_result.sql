-- Step $2 of the workflow of task $1: its state and, once completed, its
-- result (from the history, by the step's task id). No row: task $1 is
-- gone; null workflow_id: not a step; null state: no such step.
SELECT t.workflow_id, s.state, s.task_id, h.result::text AS result
FROM outbox_tasks AS t
LEFT JOIN outbox_workflow_steps AS s ON s.workflow_id = t.workflow_id AND s.name = $2
LEFT JOIN LATERAL (
    SELECT result FROM outbox_task_history WHERE id = s.task_id AND s.state = 'completed' LIMIT 1
) AS h ON true
WHERE t.id = $1
