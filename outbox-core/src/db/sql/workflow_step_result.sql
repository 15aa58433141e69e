-- Step $2 of the workflow of task $1: its state and result. No row: task
-- $1 is gone; null workflow_id: not a step; null state: no such step.
SELECT t.workflow_id, s.state, s.task_id, s.result::text AS result
FROM outbox_tasks AS t
LEFT JOIN outbox_workflow_steps AS s ON s.workflow_id = t.workflow_id AND s.name = $2
WHERE t.id = $1
