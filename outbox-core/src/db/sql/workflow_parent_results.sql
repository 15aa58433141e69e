-- The dependencies of task $1's step, in declaration order, with their
-- states and results (from the history, by task id; through the edges'
-- child index: a chord's callback reads its group without scanning the
-- workflow).
SELECT p.name, p.state, p.task_id, h.result::text AS result
FROM outbox_tasks AS t
JOIN outbox_workflow_edges AS e ON e.workflow_id = t.workflow_id AND e.child = t.workflow_step
JOIN outbox_workflow_steps AS p ON p.workflow_id = e.workflow_id AND p.name = e.parent
LEFT JOIN LATERAL (
    SELECT result FROM outbox_task_history WHERE id = p.task_id AND p.state = 'completed' LIMIT 1
) AS h ON true
WHERE t.id = $1
ORDER BY p.seq
