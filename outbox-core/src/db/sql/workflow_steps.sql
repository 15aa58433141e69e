-- The steps of workflow $1 in declaration order, each with its
-- dependencies and, while its task exists, the task's live state.
SELECT s.name, s.state, s.task_type, s.task_id, s.compensates,
       s.compensation IS NOT NULL AS has_compensation, s.finished_at, s.result,
       coalesce((SELECT array_agg(e.parent ORDER BY e.parent)
                 FROM outbox_workflow_edges AS e
                 WHERE e.workflow_id = s.workflow_id AND e.child = s.name), '{}') AS after,
       t.state::text AS task_state, t.retry_count, t.last_error
FROM outbox_workflow_steps AS s
LEFT JOIN outbox_tasks AS t ON t.id = s.task_id
WHERE s.workflow_id = $1
ORDER BY s.seq
