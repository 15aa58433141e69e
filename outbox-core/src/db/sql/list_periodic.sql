-- Every periodic task the cluster's leader has recorded, by name, and
-- whether its next tick is over a minute past on the database's clock (the
-- leader enqueues ticks ahead: no leader enqueues this one).
SELECT name, schedule, task_type, queue, payload::text AS payload, last_tick, next_tick, updated_at,
       coalesce(next_tick < now() - interval '1 minute', false) AS overdue
FROM outbox_periodic
ORDER BY name
