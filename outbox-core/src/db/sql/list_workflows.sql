-- The latest workflows, newest first. $1 state filter (null = any;
-- 'cancelled': those an operator cancelled, whatever they ended as), $2
-- limit.
SELECT id, name, state, steps, open_steps, created_at, finished_at, cancelled_at
FROM outbox_workflows
WHERE $1::text IS NULL OR state = $1 OR ($1 = 'cancelled' AND cancelled_at IS NOT NULL)
ORDER BY id DESC
LIMIT $2
