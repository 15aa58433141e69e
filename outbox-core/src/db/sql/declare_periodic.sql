-- The maintenance leader records a declared periodic task: its schedule,
-- type, queue and payload as this build declares them. A new entry starts
-- at $6 (the latest tick before now: the first run is the next tick); an
-- existing one keeps its last tick, unless its declaration changed: then
-- the ticks it enqueued ahead under the old one and not started are
-- removed. If the old declaration missed nothing (its next tick is still
-- to come), last_tick becomes $6: the new declaration's ticks are
-- enqueued from now on, as a new entry's are (keeping the old last tick,
-- older than the new schedule's latest, made that one a missed tick, run
-- at once on the change). If it did miss ticks (the cluster was down),
-- the earlier of the two stays, and the missed-tick policy decides.
-- (Matched by exact unique key: a name may contain ':'.) $7 the next tick
-- after now.
WITH old AS (
    SELECT schedule, task_type, queue, payload
    FROM outbox_periodic
    WHERE name = $1
    FOR UPDATE
),
changed AS (
    SELECT old.*
    FROM old
    WHERE (old.schedule, old.task_type, old.queue, old.payload)
          IS DISTINCT FROM ($2::text, $3::text, $4::text, $5::jsonb)
),
dropped AS (
    DELETE FROM outbox_tasks AS t
    USING changed AS c
    WHERE t.queue = c.queue AND t.task_type = c.task_type
      AND t.state = 'pending' AND t.claims = 0 AND t.dead_at IS NULL
      AND t.execute_at > now()
      AND left(t.unique_key, length('periodic:' || $1 || ':')) = 'periodic:' || $1 || ':'
      AND substr(t.unique_key, length('periodic:' || $1 || ':') + 1) ~ '^[0-9]+$'
)
INSERT INTO outbox_periodic AS p (name, schedule, task_type, queue, payload, last_tick, next_tick)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)
ON CONFLICT (name) DO UPDATE
SET schedule = excluded.schedule,
    task_type = excluded.task_type,
    queue = excluded.queue,
    payload = excluded.payload,
    last_tick = CASE WHEN NOT EXISTS (SELECT 1 FROM changed) THEN p.last_tick
                     WHEN p.next_tick > now() THEN excluded.last_tick
                     ELSE least(p.last_tick, excluded.last_tick) END,
    -- Ticks enqueued ahead (last_tick in the future) keep their next tick.
    next_tick = CASE WHEN NOT EXISTS (SELECT 1 FROM changed) AND p.last_tick >= excluded.next_tick
                     THEN p.next_tick ELSE excluded.next_tick END,
    updated_at = now()
