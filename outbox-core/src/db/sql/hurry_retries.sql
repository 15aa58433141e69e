-- Test helper (testing::drain): tasks on queues $1 that already ran and are
-- waiting to run again (a failed attempt's backoff, a snooze) become due
-- now, and each queue that had one is notified so its worker looks at once.
-- Tasks submitted with a delay (never claimed yet) are left alone.
WITH hurried AS (
    UPDATE outbox_tasks
    SET execute_at = now(), updated_at = now()
    WHERE queue = ANY($1::text[])
      AND state IN ('pending', 'failed') AND dead_at IS NULL
      AND claims > 0
      AND execute_at > now()
    RETURNING queue
)
SELECT count(pg_notify('outbox_tasks', queue))
FROM (SELECT DISTINCT queue FROM hurried) AS q
