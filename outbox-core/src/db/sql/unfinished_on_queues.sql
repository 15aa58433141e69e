-- Test helper: tasks on these queues that are due now or running.
SELECT count(*) FROM outbox_tasks
WHERE queue = ANY($1::text[])
  AND ((state IN ('pending', 'failed') AND dead_at IS NULL AND execute_at <= now())
       OR state = 'processing')
