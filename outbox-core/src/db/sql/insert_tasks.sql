-- Insert a batch of tasks in one statement and wake listening workers.
-- $1 task_type text[], $2 queue text[], $3 payload text[] (JSON),
-- $4 priority smallint[], $5 max_attempts int[], $6 run_at timestamptz[]
-- (null = not set), $7 delay in microseconds bigint[] (null = not set),
-- $8 the queues to NOTIFY (text[]; the caller leaves out queues it notified
-- a moment ago). pg_notify inside the caller's transaction is delivered
-- only at commit. $9 ordering key text[] (null = none), $10 skip_dead
-- bool[] (the triggers of migration 8 set key_seq and blocked).
WITH inserted AS (
    INSERT INTO outbox_tasks (task_type, queue, payload, priority, max_attempts, execute_at,
                              ordering_key, skip_dead)
    SELECT s.task_type, s.queue, s.payload::jsonb, s.priority, s.max_attempts,
           coalesce(s.run_at, now() + coalesce(s.delay_us, 0) * interval '1 microsecond'),
           s.ordering_key, s.skip_dead
    FROM unnest($1::text[], $2::text[], $3::text[], $4::smallint[], $5::int[],
                $6::timestamptz[], $7::bigint[], $9::text[], $10::bool[])
         AS s(task_type, queue, payload, priority, max_attempts, run_at, delay_us,
              ordering_key, skip_dead)
    RETURNING id
),
notified AS (
    SELECT pg_notify('outbox_tasks', q) FROM unnest($8::text[]) AS q
)
SELECT id FROM inserted
WHERE (SELECT count(*) FROM notified) >= 0
ORDER BY id
