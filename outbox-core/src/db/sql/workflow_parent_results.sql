-- The dependencies of task $1's step, in declaration order, with their
-- states and results (through the edges' child index: a chord's callback
-- reads its group without scanning the workflow).
SELECT p.name, p.state, p.task_id, p.result::text AS result
FROM outbox_tasks AS t
JOIN outbox_workflow_edges AS e ON e.workflow_id = t.workflow_id AND e.child = t.workflow_step
JOIN outbox_workflow_steps AS p ON p.workflow_id = e.workflow_id AND p.name = e.parent
WHERE t.id = $1
ORDER BY p.seq
