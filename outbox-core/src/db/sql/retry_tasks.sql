-- Operator retry: FAILED tasks (dead, or waiting for their next attempt)
-- become claimable now with a fresh attempt budget. $1 ids (null = every
-- dead task), $2 task type filter for the dead-task form (null = any).
UPDATE outbox_tasks
SET state = 'pending',
    retry_count = 0,
    dead_at = NULL,
    finished_at = NULL,
    execute_at = now(),
    updated_at = now()
WHERE state = 'failed'
  AND (($1::bigint[] IS NOT NULL AND id = ANY($1))
       OR ($1::bigint[] IS NULL AND dead_at IS NOT NULL AND ($2::text IS NULL OR task_type = $2)))
RETURNING id
