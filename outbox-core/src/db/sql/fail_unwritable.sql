-- The last resort for an outcome the database rejected for good (a
-- permanent error, alone in its statement): the attempt counts as failed
-- with the rejection as its error, so the task leaves PROCESSING visibly and
-- follows its retry schedule (claimable at once; dead if it was the last
-- attempt). Fenced on the claim token like every outcome.
-- $1 id, $2 claim token, $3 error message.
WITH done AS (
    UPDATE outbox_tasks
    SET state = 'failed',
        retry_count = retry_count + 1,
        dead_at = CASE WHEN retry_count + 1 >= max_attempts THEN now() END,
        execute_at = now(),
        last_error = $3,
        finished_at = now(),
        claims = claims + CASE WHEN claimed_by IS NULL THEN 1 ELSE 0 END,
        claimed_by = NULL,
        heartbeat_at = NULL,
        -- A task of a run (migration 28) is first in its key's line: it
        -- holds the key now.
        blocked = false,
        updated_at = now()
    WHERE id = $1
      AND (claimed_by = $2
           -- A task its run holds in place without a write (migration 56).
           OR outbox_tasks.claimed_by IS NULL AND outbox_tasks.blocked AND outbox_tasks.state = 'pending'
              AND outbox_run_claim(outbox_tasks.queue, outbox_tasks.ordering_key, outbox_tasks.key_seq) = $2)
    RETURNING id, queue, ordering_key, state, dead_at, skip_dead
),
handed AS (
    -- Tasks that let go of their ordering key hand it on (after every row
    -- above is written: the aggregate reads them all first).
    SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key)) AS n
    FROM done
    WHERE ordering_key IS NOT NULL
      AND NOT (state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead))
    HAVING count(*) > 0
)
SELECT id FROM done WHERE (SELECT count(*) FROM handed) >= 0
