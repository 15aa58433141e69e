-- Every periodic task the cluster's leader has recorded, by name.
SELECT name, schedule, task_type, queue, payload::text AS payload, last_tick, next_tick, updated_at
FROM outbox_periodic
ORDER BY name
