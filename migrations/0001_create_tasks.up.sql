-- outbox: the task table, its state type and the indexes the engine relies on.

CREATE TYPE outbox_task_state AS ENUM ('pending', 'processing', 'completed', 'failed');

CREATE TABLE outbox_tasks (
    -- Database-assigned sequence: the task id handed to handlers (the
    -- idempotency key) and the final tie-breaker of the claim order.
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_type    text NOT NULL,
    queue        text NOT NULL,
    payload      jsonb NOT NULL,
    state        outbox_task_state NOT NULL DEFAULT 'pending',
    -- 0 runs first, 9 runs last.
    priority     smallint NOT NULL DEFAULT 0,
    -- Failed attempts so far (a handler error or a lost worker); the task is
    -- dead when this reaches max_attempts (the retry table's length).
    retry_count  integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    -- Times this task was claimed. The outcome of an attempt is written only
    -- if this still equals the value the claim returned (fencing).
    claims       integer NOT NULL DEFAULT 0,
    -- When the task becomes claimable (again).
    execute_at   timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    -- Which worker holds a PROCESSING task and when it last said so. The
    -- heartbeat is its own column so it never competes with updated_at.
    claimed_by   text,
    heartbeat_at timestamptz,
    -- When the task reached COMPLETED or FAILED (cleanup uses it).
    finished_at  timestamptz,
    -- Set when the task is dead: FAILED with no attempts left, or given up.
    dead_at      timestamptz,
    last_error   text,
    CONSTRAINT outbox_tasks_priority_range CHECK (priority BETWEEN 0 AND 9),
    CONSTRAINT outbox_tasks_max_attempts_positive CHECK (max_attempts >= 1),
    CONSTRAINT outbox_tasks_only_failed_is_dead CHECK (dead_at IS NULL OR state = 'failed'),
    -- A PROCESSING task, and only one, has a claim holder: outcome writes
    -- rely on it to recognise the rows still being processed.
    CONSTRAINT outbox_tasks_claim_holder CHECK ((state = 'processing') = (claimed_by IS NOT NULL))
);

-- The hot fetch index: only claimable rows, so completed history and dead
-- tasks never make a claim slower. The claim query repeats this predicate
-- word for word so the planner can use the index.
CREATE INDEX outbox_tasks_claimable_idx
    ON outbox_tasks (queue, priority, execute_at, id)
    WHERE state IN ('pending', 'failed') AND dead_at IS NULL;

-- In-flight tasks by heartbeat, for stuck-task recovery.
CREATE INDEX outbox_tasks_processing_idx
    ON outbox_tasks (heartbeat_at)
    WHERE state = 'processing';

-- Completed tasks by age, so cleanup deletes in bounded batches without a
-- table scan.
CREATE INDEX outbox_tasks_completed_idx
    ON outbox_tasks (finished_at)
    WHERE state = 'completed';

-- Dead tasks, for operators listing and retrying them.
CREATE INDEX outbox_tasks_dead_idx
    ON outbox_tasks (task_type, dead_at)
    WHERE dead_at IS NOT NULL;

-- A queue table churns: every task leaves dead row versions behind as it
-- moves from pending to processing to completed, and the claim's index scan
-- walks over their index entries until vacuum removes them. Vacuum it after
-- 1% of its rows changed (not PostgreSQL's default 20%), without throttling.
ALTER TABLE outbox_tasks SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
