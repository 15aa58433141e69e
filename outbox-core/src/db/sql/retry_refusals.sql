-- Why tasks an operator asked to retry by id were not retried (after
-- retry_tasks.sql left them): one row per id in $1, with the reason read
-- as the task is now. The same rules as that statement, told apart.
SELECT i.id,
       CASE
           WHEN t.id IS NULL AND EXISTS (SELECT 1 FROM outbox_intake AS n WHERE n.id = i.id)
               THEN 'due already'
           WHEN t.id IS NULL AND EXISTS (SELECT 1 FROM outbox_task_history AS h WHERE h.id = i.id)
               THEN 'completed'
           WHEN t.id IS NULL THEN 'no such task'
           WHEN t.state = 'completed' THEN 'completed'
           WHEN t.state = 'processing' OR t.claimed_by IS NOT NULL THEN 'running'
           WHEN w.id IS NOT NULL AND s.compensates IS NULL
                AND (w.cancelled_at IS NOT NULL
                     OR w.state IN ('compensating', 'compensated', 'compensation_failed'))
               THEN format('a forward step of workflow %s, which is %s', w.id,
                           CASE WHEN w.cancelled_at IS NOT NULL THEN 'cancelled'
                                ELSE w.state::text END)
           WHEN t.state = 'failed' AND holder.id IS NOT NULL
               THEN format('its unique key is held by task %s', holder.id)
           WHEN t.state = 'pending' AND t.blocked THEN 'due, waiting for its ordering key'
           WHEN t.state = 'pending' THEN 'due already'
           ELSE 'changed meanwhile: look at it again'
       END AS reason
FROM unnest($1::bigint[]) WITH ORDINALITY AS i(id, n)
LEFT JOIN outbox_tasks AS t ON t.id = i.id
LEFT JOIN outbox_workflows AS w ON w.id = t.workflow_id
LEFT JOIN outbox_workflow_steps AS s ON s.workflow_id = t.workflow_id AND s.name = t.workflow_step
LEFT JOIN LATERAL (
    SELECT o.id FROM outbox_tasks AS o
    WHERE t.unique_key IS NOT NULL AND o.unique_key = t.unique_key AND o.id <> t.id
      AND outbox_unique_covers(o.unique_states, o.state, o.dead_at IS NOT NULL)
    ORDER BY o.id
    LIMIT 1
) AS holder ON true
ORDER BY i.n
