-- Enqueue tick $2 of periodic task $1, exactly once across the cluster:
-- last_tick moves forward only if it is behind (the row lock makes a second
-- leader wait, then find it moved), and the task carries the unique key
-- 'periodic:<name>:<tick>' covering every state. Fenced on the maintenance
-- lease ($9 holder): a leader that lost its lease enqueues nothing.
-- $3 next tick, $4 task type, $5 queue, $6 payload (JSON text), $7 max
-- attempts, $8 priority, $10 whether to run the tick (false: a missed tick
-- of a task that skips them; only last_tick moves), $11 ordering key (null:
-- none), $12 skip_dead, as a submit of the type sets them. Returns whether
-- last_tick moved, the last tick before it moved (null if none or not
-- moved), and the new task's id if one was enqueued. (The old last tick
-- comes from a locking subquery of the UPDATE itself: a separate locking
-- CTE would find the row updated by this very statement and return
-- nothing.)
WITH moved AS (
    UPDATE outbox_periodic AS p
    SET last_tick = $2, next_tick = $3
    FROM (SELECT name, last_tick FROM outbox_periodic WHERE name = $1 FOR UPDATE) AS old
    WHERE p.name = old.name
      AND (p.last_tick IS NULL OR p.last_tick < $2)
      AND EXISTS (SELECT 1 FROM outbox_leases
                  WHERE name = 'maintenance' AND holder = $9 AND expires_at > now())
    RETURNING p.name, old.last_tick AS was
),
ins AS (
    INSERT INTO outbox_tasks (task_type, queue, payload, priority, max_attempts, execute_at,
                              unique_key, unique_states, ordering_key, skip_dead)
    SELECT $4, $5, $6::jsonb, $8, $7, $2,
           'periodic:' || $1 || ':' || extract(epoch FROM $2::timestamptz)::bigint, 31, $11, $12
    FROM moved
    WHERE $10::bool
    ON CONFLICT (unique_key)
        WHERE unique_key IS NOT NULL
          AND outbox_unique_covers(unique_states, state, dead_at IS NOT NULL)
        DO NOTHING
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM moved) AS moved, (SELECT was FROM moved) AS was,
       (SELECT id FROM ins) AS id
