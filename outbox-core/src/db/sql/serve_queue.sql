-- A worker's look at a queue it serves: adds the queue's row (no limits)
-- if there is none, and returns its settings. Run before the first claim
-- and about once a second while claiming. $1 queue.
WITH added AS (
    INSERT INTO outbox_queues (name) VALUES ($1)
    ON CONFLICT (name) DO NOTHING
    RETURNING name, paused_at, global_concurrency, rate_per_second, per_key_concurrency, updated_at
)
SELECT name, paused_at, global_concurrency, rate_per_second, per_key_concurrency, updated_at
FROM added
UNION ALL
SELECT name, paused_at, global_concurrency, rate_per_second, per_key_concurrency, updated_at
FROM outbox_queues WHERE name = $1
