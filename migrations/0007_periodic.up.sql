-- outbox: periodic tasks. One row per declared periodic task, written by
-- the maintenance leader. Enqueueing a tick moves last_tick forward in the
-- same statement that inserts the task, and only if it is still behind, so
-- two leaders at once (one of them silent and about to find out) cannot
-- both enqueue a tick; the task's unique key (name and tick) says the same
-- a second time.
CREATE TABLE outbox_periodic (
    name       text PRIMARY KEY,
    schedule   text NOT NULL,
    task_type  text NOT NULL,
    queue      text NOT NULL,
    payload    jsonb NOT NULL,
    -- The latest tick enqueued (or, for a new entry, the latest tick before
    -- it was declared: the first run is the next tick).
    last_tick  timestamptz,
    next_tick  timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
