-- Test helper (testing::drain): tasks on these queues that are due now,
-- running, or waiting to run again after an attempt (backoff, snooze).
-- Tasks submitted with a delay and never claimed are not counted, nor
-- tasks waiting for their ordering key (they run when the task holding it
-- finishes, which is counted; behind a dead one they never would).
-- Tasks in the intake (migration 31) are due now.
SELECT (SELECT count(*) FROM outbox_tasks
WHERE queue = ANY($1::text[])
  AND ((state IN ('pending', 'failed') AND dead_at IS NULL AND NOT blocked
        AND (execute_at <= now() OR claims > 0))
       OR state = 'processing'))
     + (SELECT count(*) FROM outbox_intake WHERE queue = ANY($1::text[]))
