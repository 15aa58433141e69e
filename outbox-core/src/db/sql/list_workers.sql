-- Operator view: every worker that reported itself, the live ones first.
SELECT id, host, pid, queues::text AS queues, started_at, last_seen_at, expires_at,
       expires_at > now() AS alive
FROM outbox_workers
ORDER BY expires_at > now() DESC, started_at
