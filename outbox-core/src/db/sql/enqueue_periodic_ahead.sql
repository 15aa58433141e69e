-- Enqueue the ticks $2 (ascending, all after now) of periodic task $1 that
-- are past its last_tick, in one statement, each due at its time with the
-- unique key 'periodic:<name>:<tick>' covering every state, and move
-- last_tick to the latest. The row lock on outbox_periodic makes a second
-- leader wait, then find last_tick moved. Fenced on the maintenance lease
-- ($9 holder). $3 the tick after the last of $2; $4 task type, $5 queue,
-- $6 payload (JSON text), $7 max attempts, $8 priority, $10 ordering key
-- (null: none), $11 skip_dead, as a submit of the type sets them. Returns
-- the new tasks' ids.
WITH cur AS (
    SELECT last_tick
    FROM outbox_periodic
    WHERE name = $1
      AND EXISTS (SELECT 1 FROM outbox_leases
                  WHERE name = 'maintenance' AND holder = $9 AND expires_at > now())
    FOR UPDATE
),
new AS (
    SELECT t
    FROM unnest($2::timestamptz[]) AS t, cur
    WHERE cur.last_tick IS NULL OR t > cur.last_tick
),
moved AS (
    UPDATE outbox_periodic
    SET last_tick = (SELECT max(t) FROM new), next_tick = $3
    WHERE name = $1 AND EXISTS (SELECT 1 FROM new)
)
INSERT INTO outbox_tasks (task_type, queue, payload, priority, max_attempts, execute_at,
                          unique_key, unique_states, ordering_key, skip_dead)
SELECT $4, $5, $6::jsonb, $8, $7, new.t,
       'periodic:' || $1 || ':' || extract(epoch FROM new.t)::bigint, 31, $10, $11
FROM new
ORDER BY new.t
ON CONFLICT (unique_key)
    WHERE unique_key IS NOT NULL
      AND outbox_unique_covers(unique_states, state, dead_at IS NOT NULL)
    DO NOTHING
RETURNING id
