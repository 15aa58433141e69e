-- Tasks for operators, newest first. $1 state filter (text, null = any;
-- 'dead' means dead tasks), $2 task type (null = any), $3 limit.
SELECT id, task_type, queue,
       CASE WHEN dead_at IS NOT NULL THEN 'dead' ELSE state::text END AS state,
       priority, retry_count, max_attempts, claims, execute_at, created_at, updated_at,
       finished_at, dead_at, claimed_by, heartbeat_at, last_error, payload::text AS payload
FROM outbox_tasks
WHERE ($1::text IS NULL
       OR ($1 = 'dead' AND dead_at IS NOT NULL)
       OR ($1 <> 'dead' AND state::text = $1 AND dead_at IS NULL))
  AND ($2::text IS NULL OR task_type = $2)
ORDER BY id DESC
LIMIT $3
