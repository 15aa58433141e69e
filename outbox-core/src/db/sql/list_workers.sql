-- Operator view: every worker that reported itself, the live ones first,
-- and which of them holds the maintenance lease (its holder is the
-- worker's run id): the leader, which alone enqueues periodic ticks.
SELECT id, host, pid, queues::text AS queues, started_at, last_seen_at, expires_at,
       expires_at > now() AS alive,
       EXISTS (SELECT 1 FROM outbox_leases AS l
               WHERE l.name = 'maintenance' AND l.holder = w.id AND l.expires_at > now()) AS leader
FROM outbox_workers AS w
ORDER BY expires_at > now() DESC, started_at
