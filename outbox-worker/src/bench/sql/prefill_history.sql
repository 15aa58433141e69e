-- Pre-fills history for the benchmark: $1 COMPLETED rows and $2 dead rows
-- on the bench queue, written server-side in one statement each.
WITH completed AS (
    INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, state, finished_at, execute_at, created_at)
    SELECT 'outbox.noop', 'outbox-bench', '{}', 10, 'completed', now() - interval '1 hour',
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
