-- outbox: unique tasks. A task may carry a unique key; while it is in one
-- of the states its uniqueness covers, no other task with the same key can
-- be inserted. A unique index enforces it, so two concurrent submits can
-- never both insert (no check-then-insert race).

-- The full key: task type, the caller's key, and the period bucket for
-- "at most one per period" (computed on the database clock at insert).
ALTER TABLE outbox_tasks ADD COLUMN unique_key text;
-- Which states the uniqueness covers, as bits: 1 pending, 2 processing,
-- 4 failed with attempts left, 8 completed, 16 dead. The first three are
-- always set (a task moves between them and back, so covering only some
-- of them would let its own retry collide with a newer task).
ALTER TABLE outbox_tasks ADD COLUMN unique_states smallint;

-- Whether a task's uniqueness covers its current state. Immutable, so that
-- the unique index below can use it in its predicate.
CREATE FUNCTION outbox_unique_covers(states smallint, state outbox_task_state, dead boolean)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (states & CASE
        WHEN dead THEN 16
        WHEN state = 'pending' THEN 1
        WHEN state = 'processing' THEN 2
        WHEN state = 'failed' THEN 4
        ELSE 8
    END) <> 0
$$;

-- Only rows with a key, in a covered state: tasks without a key cost
-- nothing here, and a key is free again once its task left the covered
-- states.
CREATE UNIQUE INDEX outbox_tasks_unique_idx
    ON outbox_tasks (unique_key)
    WHERE unique_key IS NOT NULL
      AND outbox_unique_covers(unique_states, state, dead_at IS NOT NULL);
