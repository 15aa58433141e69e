-- The last resort for an outcome the database rejected for good (a
-- permanent error, alone in its statement): the attempt counts as failed
-- with the rejection as its error, so the task leaves PROCESSING visibly and
-- follows its retry schedule (claimable at once; dead if it was the last
-- attempt). Fenced on the claim token like every outcome.
-- $1 id, $2 claim token, $3 error message.
UPDATE outbox_tasks
SET state = 'failed',
    retry_count = retry_count + 1,
    dead_at = CASE WHEN retry_count + 1 >= max_attempts THEN now() END,
    execute_at = now(),
    last_error = $3,
    finished_at = now(),
    claimed_by = NULL,
    heartbeat_at = NULL,
    updated_at = now()
WHERE id = $1
  AND claimed_by = $2
