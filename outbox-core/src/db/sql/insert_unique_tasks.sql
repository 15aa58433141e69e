-- Insert a batch in which some tasks are unique; a task whose full unique
-- key is held by a task in a covered state is skipped (ON CONFLICT on
-- outbox_tasks_unique_idx: a concurrent insert of the same key waits for
-- the other transaction, then is skipped if it committed). Parameters as in
-- insert_tasks.sql, plus $9 unique key text[] (null = not unique), $10
-- unique states smallint[], $11 unique period in microseconds bigint[]
-- (null = none), $12 ordering key text[], $13 skip_dead bool[].
--
-- Returns one row per input task (ord set, its full key) and one per
-- inserted task (ord null, its id and key); the caller matches them.
WITH input AS (
    SELECT s.*,
           CASE WHEN s.ukey IS NULL THEN NULL
                WHEN s.period_us IS NULL THEN s.ukey
                ELSE s.ukey || ':' || floor(extract(epoch FROM now()) * 1000000 / s.period_us)::bigint::text
           END AS full_key
    FROM unnest($1::text[], $2::text[], $3::text[], $4::smallint[], $5::int[],
                $6::timestamptz[], $7::bigint[], $9::text[], $10::smallint[], $11::bigint[],
                $12::text[], $13::bool[])
         WITH ORDINALITY
         AS s(task_type, queue, payload, priority, max_attempts, run_at, delay_us,
              ukey, ustates, period_us, ordering_key, skip_dead, ord)
),
inserted AS (
    INSERT INTO outbox_tasks (task_type, queue, payload, priority, max_attempts, execute_at,
                              unique_key, unique_states, ordering_key, skip_dead)
    SELECT task_type, queue, payload::jsonb, priority, max_attempts,
           coalesce(run_at, now() + coalesce(delay_us, 0) * interval '1 microsecond'),
           full_key, ustates, ordering_key, skip_dead
    FROM input
    ORDER BY ord
    ON CONFLICT (unique_key)
        WHERE unique_key IS NOT NULL
          AND outbox_unique_covers(unique_states, state, dead_at IS NOT NULL)
        DO NOTHING
    RETURNING id, unique_key
),
notified AS (
    SELECT pg_notify('outbox_tasks', q) FROM unnest($8::text[]) AS q
)
SELECT ord, full_key AS key, NULL::bigint AS id FROM input
WHERE (SELECT count(*) FROM notified) >= 0
UNION ALL
SELECT NULL, unique_key, id FROM inserted
