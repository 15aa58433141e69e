-- The dependencies of task $1's step, in declaration order, with their
-- states and results (from the history, by task id; each parent by the
-- steps' primary key, from the step's list of its parents: a chord's
-- callback reads its group without scanning the workflow).
SELECT p.name, p.state, p.task_id, h.result::text AS result
FROM outbox_tasks AS t
JOIN outbox_workflow_steps AS c ON c.workflow_id = t.workflow_id AND c.name = t.workflow_step
CROSS JOIN LATERAL unnest(c.parent_names) AS pn(name)
JOIN outbox_workflow_steps AS p ON p.workflow_id = c.workflow_id AND p.name = pn.name
LEFT JOIN LATERAL (
    SELECT result FROM outbox_task_history WHERE id = p.task_id AND p.state = 'completed' LIMIT 1
) AS h ON true
WHERE t.id = $1
ORDER BY p.seq
