-- Operator cancel of tasks that are not running: they become dead (FAILED,
-- never claimed again, kept for the record). Running, finished and already
-- dead tasks are left alone. $1 ids.
UPDATE outbox_tasks
SET state = 'failed',
    dead_at = now(),
    finished_at = now(),
    last_error = 'cancelled by an operator',
    updated_at = now()
WHERE id = ANY($1::bigint[])
  AND state IN ('pending', 'failed')
  AND dead_at IS NULL
RETURNING id
