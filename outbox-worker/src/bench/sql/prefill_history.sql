-- Pre-fills history for the benchmark: $1 completed tasks in the history
-- (finished an hour ago) and $2 dead tasks in outbox_tasks, on the bench
-- queue, written server-side in one statement each.
WITH completed AS (
    INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                     max_attempts, claims, execute_at, created_at, finished_at)
    SELECT nextval(pg_get_serial_sequence('outbox_tasks', 'id')), 'outbox.noop', 'outbox-bench', '{}', 0, 0, 10, 1, now() - interval '1 hour',
           now() - interval '1 hour', now() - interval '1 hour'
    FROM generate_series(1, $1::bigint)
    RETURNING 1
), dead AS (
    INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, retry_count, state, finished_at, dead_at,
                              last_error, execute_at)
    SELECT 'outbox.fail', 'outbox-bench', '{"times": 99}', 3, 3, 'failed', now(), now(),
           'bench: pre-filled dead task', now() - interval '1 hour'
    FROM generate_series(1, $2::bigint)
    RETURNING 1
)
SELECT (SELECT count(*) FROM completed) + (SELECT count(*) FROM dead)
