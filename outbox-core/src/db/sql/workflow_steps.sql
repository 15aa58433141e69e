-- The steps of workflow $1 in declaration order, each with its
-- dependencies, while its task exists the task's live state (dead as
-- get_task.sql says it, not the row's state) and when it is due, and once
-- completed its result (from the history) and the state `completed`.
SELECT s.name, s.state, s.task_type, s.task_id, s.compensates,
       s.compensation IS NOT NULL AS has_compensation, s.finished_at, h.result,
       s.parent_names AS after,
       CASE WHEN t.dead_at IS NOT NULL THEN 'dead'
            WHEN t.id IS NOT NULL THEN t.state::text
            WHEN h.kept THEN 'completed' END AS task_state,
       t.retry_count, t.last_error,
       CASE WHEN t.state IN ('pending', 'failed') AND t.dead_at IS NULL THEN t.execute_at END AS due_at
FROM outbox_workflow_steps AS s
LEFT JOIN outbox_tasks AS t ON t.id = s.task_id
LEFT JOIN LATERAL (
    SELECT true AS kept, result FROM outbox_task_history
    WHERE id = s.task_id AND s.state = 'completed' LIMIT 1
) AS h ON true
WHERE s.workflow_id = $1
ORDER BY s.seq
