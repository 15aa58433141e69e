-- The workflow and step of task $1 (a live task: its handler asks).
SELECT workflow_id, workflow_step FROM outbox_tasks WHERE id = $1
