-- Operator view: every queue with settings (workers add one per queue they
-- serve), by name.
SELECT name, paused_at, global_concurrency, rate_per_second, per_key_concurrency, updated_at
FROM outbox_queues
ORDER BY name
