-- The maintenance leader records a declared periodic task: its schedule,
-- type, queue and payload as this build declares them. A new entry starts
-- at $6 (the latest tick before now: the first run is the next tick); an
-- existing one keeps its last tick.
INSERT INTO outbox_periodic (name, schedule, task_type, queue, payload, last_tick, next_tick)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)
ON CONFLICT (name) DO UPDATE
SET schedule = excluded.schedule,
    task_type = excluded.task_type,
    queue = excluded.queue,
    payload = excluded.payload,
    -- Ticks enqueued ahead (last_tick in the future) keep their next tick.
    next_tick = CASE WHEN outbox_periodic.last_tick >= excluded.next_tick
                     THEN outbox_periodic.next_tick ELSE excluded.next_tick END,
    updated_at = now()
