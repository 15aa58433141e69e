-- Which of a worker's periodic tasks (names $1, schedules $2, types $3,
-- queues $4, payloads $5 as JSON text) the current maintenance leader does
-- not declare as that worker does: no record, another schedule, type,
-- queue or payload, or a record no one declared during this leadership
-- (the leader records its declarations at its start, as
-- delete_periodic.sql judges). Only the leader enqueues ticks, so those
-- run only while a worker declaring them leads. With whether the
-- leadership is older than $6 microseconds (before that, its first round
-- may still be declaring); no row while no one leads.
SELECT l.acquired_at < now() - $6 * interval '1 microsecond' AS settled,
       coalesce((
           SELECT array_agg(d.name ORDER BY d.name)
           FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
                    AS d (name, schedule, task_type, queue, payload)
           WHERE NOT EXISTS (
               SELECT 1 FROM outbox_periodic AS p
               WHERE p.name = d.name AND p.updated_at >= l.acquired_at
                 AND (p.schedule, p.task_type, p.queue, p.payload)
                     = (d.schedule, d.task_type, d.queue, d.payload::jsonb))),
           '{}') AS names
FROM outbox_leases AS l
WHERE l.name = 'maintenance' AND l.expires_at > now()
