-- One workflow. $1 id.
SELECT id, name, state, steps, open_steps, created_at, finished_at, cancelled_at
FROM outbox_workflows
WHERE id = $1
