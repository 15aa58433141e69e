-- $1 completed tasks of the bench queue in the history, finished through
-- the UTC day of $2 (one second apart, wrapping around the day).
INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                 max_attempts, claims, execute_at, created_at, finished_at)
SELECT nextval(pg_get_serial_sequence('outbox_tasks', 'id')), 'outbox.noop', 'outbox-bench', '{}',
       0, 0, 10, 1, d, d, d + (n % 86400) * interval '1 second'
FROM generate_series(1, $1::bigint) AS n,
     (SELECT date_trunc('day', $2::timestamptz AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS d) AS day
