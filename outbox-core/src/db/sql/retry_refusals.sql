-- Why tasks an operator asked to retry by id were not retried (after
-- retry_tasks.sql and revive_completed.sql left them): one row per id in
-- $1, with the reason read as the task is now. The same rules as those
-- statements, told apart.
SELECT i.id,
       CASE
           WHEN t.id IS NULL AND EXISTS (SELECT 1 FROM outbox_intake AS n WHERE n.id = i.id)
               THEN 'due already'
           WHEN t.id IS NULL AND hist.id IS NULL THEN 'no such task'
           WHEN t.state = 'processing' OR t.claimed_by IS NOT NULL THEN 'running'
           -- Held in place by its run without a write (migration 56).
           WHEN t.state = 'pending' AND t.blocked
                AND outbox_run_claim(t.queue, t.ordering_key, t.key_seq) IS NOT NULL THEN 'running'
           WHEN w.id IS NOT NULL AND s.compensates IS NULL
                AND (w.cancelled_at IS NOT NULL
                     OR w.state IN ('compensating', 'compensated', 'compensation_failed'))
               THEN format('a forward step of workflow %s, which is %s', w.id,
                           CASE WHEN w.cancelled_at IS NOT NULL THEN 'cancelled'
                                ELSE w.state::text END)
           WHEN (t.state = 'completed' AND t.workflow_id IS NOT NULL)
                OR (hist.id IS NOT NULL
                    AND EXISTS (SELECT 1 FROM outbox_workflow_steps AS ws WHERE ws.task_id = i.id))
               THEN 'a completed step of a workflow: run outside it, it would miss its parents'
           WHEN (t.state IN ('failed', 'completed') OR hist.id IS NOT NULL) AND holder.id IS NOT NULL
               THEN format('its unique key is held by task %s', holder.id)
           WHEN t.state = 'pending' AND t.blocked THEN 'due, waiting for its ordering key'
           WHEN t.state = 'pending' THEN 'due already'
           ELSE 'changed meanwhile: look at it again'
       END AS reason
FROM unnest($1::bigint[]) WITH ORDINALITY AS i(id, n)
LEFT JOIN outbox_tasks AS t ON t.id = i.id
LEFT JOIN LATERAL (
    SELECT h.id, h.unique_key FROM outbox_task_history AS h WHERE h.id = i.id LIMIT 1
) AS hist ON t.id IS NULL
LEFT JOIN outbox_workflows AS w ON w.id = t.workflow_id
LEFT JOIN outbox_workflow_steps AS s ON s.workflow_id = t.workflow_id AND s.name = t.workflow_step
LEFT JOIN LATERAL (
    SELECT o.id FROM outbox_tasks AS o
    WHERE o.unique_key = coalesce(t.unique_key, hist.unique_key) AND o.id <> i.id
      AND outbox_unique_covers(o.unique_states, o.state, o.dead_at IS NOT NULL)
    ORDER BY o.id
    LIMIT 1
) AS holder ON true
ORDER BY i.n
