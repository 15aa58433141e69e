-- After downtime (the leader found the latest tick $2 of periodic task $1
-- not enqueued: no leader ran through the ticks enqueued ahead), the ticks
-- enqueued ahead before it and never started are missed ticks: they are
-- removed, so that MissedTicks alone decides what runs (the latest, once,
-- or none). Matched by their exact unique key (a name may contain ':').
-- $3 task type, $4 queue, $5 the earliest a tick enqueued ahead can be due
-- (the last tick before the downtime less the leader's horizon; null: no
-- bound): ticks due before it were enqueued when they came due, while a
-- leader ran, and wait in the queue's backlog; they are not missed and
-- stay. Returns how many.
WITH dropped AS (
    DELETE FROM outbox_tasks
    WHERE queue = $4 AND task_type = $3
      AND state = 'pending' AND claims = 0 AND dead_at IS NULL
      -- Not one a run holds without a write (migration 56): it may be
      -- running.
      AND NOT (blocked AND claimed_by IS NULL
               AND outbox_run_claim(queue, ordering_key, key_seq) IS NOT NULL)
      AND execute_at < $2
      AND ($5::timestamptz IS NULL OR execute_at > $5::timestamptz)
      AND left(unique_key, length('periodic:' || $1 || ':')) = 'periodic:' || $1 || ':'
      AND substr(unique_key, length('periodic:' || $1 || ':') + 1) ~ '^[0-9]+$'
    RETURNING 1
)
SELECT count(*) FROM dropped
