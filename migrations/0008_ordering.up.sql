-- outbox: ordering keys, queue settings for the whole cluster, and workers
-- that can be seen.

-- Tasks with the same ordering key in a queue run one at a time (or up to
-- the queue's per_key_concurrency), in the order of key_seq. A task that
-- may not run yet because earlier tasks of its key hold it is "blocked";
-- the flag is kept up to date by the triggers below when a task is
-- inserted and when a task of the key finishes, so a claim never searches
-- for earlier unfinished tasks (which costs time in proportion to a hot
-- key's backlog) but reads the flag from its partial index.
ALTER TABLE outbox_tasks
    ADD COLUMN ordering_key text,
    -- From outbox_key_seq, drawn while the key's lock is held: the order
    -- in which the submitting transactions committed.
    ADD COLUMN key_seq bigint,
    ADD COLUMN blocked boolean NOT NULL DEFAULT false,
    -- When this task is dead, its key goes on without it: set at insert for
    -- task types that choose to skip, and by an operator's cancel or skip.
    ADD COLUMN skip_dead boolean NOT NULL DEFAULT false,
    -- When the latest attempt started (the claim), next to finished_at.
    ADD COLUMN attempted_at timestamptz;

-- The hot fetch index again, without blocked tasks: a hot key's backlog
-- never lies in a claim's path. The claim query repeats this predicate
-- word for word.
DROP INDEX outbox_tasks_claimable_idx;
CREATE INDEX outbox_tasks_claimable_idx
    ON outbox_tasks (queue, priority, execute_at, id)
    WHERE state IN ('pending', 'failed') AND dead_at IS NULL AND NOT blocked;

-- The tasks that hold their key: not blocked, not finished, and not dead
-- tasks that let their key go on. At most per_key_concurrency per key.
CREATE INDEX outbox_tasks_key_holders_idx
    ON outbox_tasks (queue, ordering_key)
    WHERE ordering_key IS NOT NULL AND NOT blocked AND state <> 'completed'
      AND (dead_at IS NULL OR NOT skip_dead);

-- The tasks waiting for their key, in key order: the next to run is the
-- first entry.
CREATE INDEX outbox_tasks_key_waiting_idx
    ON outbox_tasks (queue, ordering_key, key_seq)
    WHERE blocked;

CREATE SEQUENCE outbox_key_seq;

-- One row per ordering key in use: the lock that orders the inserts of a
-- key's tasks and the hand-over from a finished task to the next. A
-- submitting transaction holds it until it commits, so the tasks of one key
-- get their key_seq in commit order. Maintenance deletes rows of keys
-- without unfinished tasks; ordering does not depend on a row's age
-- (key_seq comes from one sequence).
CREATE TABLE outbox_keys (
    queue        text NOT NULL,
    ordering_key text NOT NULL,
    used_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, ordering_key)
);

-- Settings of a queue for every worker of the cluster. A worker adds a row
-- with no limits for each queue it serves before it claims. A claim of a
-- queue without limits holds the row FOR SHARE, so a change of settings
-- waits for claims in flight and every later claim sees it.
CREATE TABLE outbox_queues (
    name                text PRIMARY KEY,
    -- Set while paused: no new claims anywhere.
    paused_at           timestamptz,
    -- At most this many tasks of the queue PROCESSING at once, cluster-wide.
    global_concurrency  integer CHECK (global_concurrency >= 1),
    -- At most this many attempts started per second, cluster-wide (a token
    -- bucket: rate_tokens as of rate_filled_at).
    rate_per_second     double precision CHECK (rate_per_second > 0),
    rate_tokens         double precision,
    rate_filled_at      timestamptz,
    -- Tasks of one ordering key running at once.
    per_key_concurrency integer NOT NULL DEFAULT 1 CHECK (per_key_concurrency >= 1),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- Each running worker, as it reported itself.
CREATE TABLE outbox_workers (
    id           text PRIMARY KEY,
    host         text NOT NULL,
    pid          integer NOT NULL,
    -- [{"queue": "default", "concurrency": 10}, ...]
    queues       jsonb NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    -- Alive until then unless it reports again (a few heartbeat intervals).
    expires_at   timestamptz NOT NULL
);

-- Whether a task in this state still needs its key (holding or waiting).
CREATE FUNCTION outbox_needs_key(state outbox_task_state, dead_at timestamptz, skip_dead boolean)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead) $$;

-- Takes the lock of key (q, k) until the end of the transaction.
CREATE FUNCTION outbox_lock_key(q text, k text) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO outbox_keys AS t (queue, ordering_key) VALUES (q, k)
    ON CONFLICT (queue, ordering_key) DO UPDATE SET used_at = now()
$$;

-- Whether a task of key (q, k) arriving now (or coming back) must wait:
-- the key's holders, task `self` left out, already fill its concurrency,
-- or earlier tasks are waiting. Call with the key's lock held.
CREATE FUNCTION outbox_key_full(q text, k text, self bigint) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    lim integer := coalesce((SELECT per_key_concurrency FROM outbox_queues WHERE name = q), 1);
BEGIN
    RETURN EXISTS (SELECT 1 FROM outbox_tasks
                   WHERE queue = q AND ordering_key = k AND blocked
                     AND state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead))
        OR (SELECT count(*) FROM (
                SELECT 1 FROM outbox_tasks
                WHERE queue = q AND ordering_key = k
                  AND ordering_key IS NOT NULL AND NOT blocked AND state <> 'completed'
                  AND (dead_at IS NULL OR NOT skip_dead)
                  AND id IS DISTINCT FROM self
                LIMIT lim) AS holders) >= lim;
END
$$;

-- Hands key (q, k) to the next waiting tasks, as many as its concurrency
-- allows now. Returns how many. Runs after the statement that made a task
-- let go of the key (an AFTER trigger), so that a statement changing
-- several tasks of one key (an operator's bulk cancel) has changed them all
-- before any is handed the key.
CREATE FUNCTION outbox_key_advance(q text, k text) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    lim integer := coalesce((SELECT per_key_concurrency FROM outbox_queues WHERE name = q), 1);
    free integer;
    moved integer := 0;
    n integer;
BEGIN
    PERFORM outbox_lock_key(q, k);
    -- Twice at most: a waiting task an operator cancelled at this very
    -- moment is passed over by the first round.
    FOR round IN 1..2 LOOP
        free := lim - (SELECT count(*) FROM (
                SELECT 1 FROM outbox_tasks
                WHERE queue = q AND ordering_key = k
                  AND ordering_key IS NOT NULL AND NOT blocked AND state <> 'completed'
                  AND (dead_at IS NULL OR NOT skip_dead)
                LIMIT lim) AS holders);
        EXIT WHEN free <= 0;
        -- Waiting tasks that left the line in the same statement (a bulk
        -- cancel) still carry the flag until their own trigger drops it.
        UPDATE outbox_tasks SET blocked = false
        WHERE id IN (SELECT id FROM outbox_tasks
                     WHERE queue = q AND ordering_key = k AND blocked
                       AND state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead)
                     ORDER BY key_seq LIMIT free)
          AND blocked AND state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead);
        GET DIAGNOSTICS n = ROW_COUNT;
        moved := moved + n;
        EXIT WHEN n >= free
               OR NOT EXISTS (SELECT 1 FROM outbox_tasks
                              WHERE queue = q AND ordering_key = k AND blocked
                                AND state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead));
    END LOOP;
    RETURN moved;
END
$$;

CREATE FUNCTION outbox_key_on_insert() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM outbox_lock_key(NEW.queue, NEW.ordering_key);
    NEW.key_seq := nextval('outbox_key_seq');
    NEW.blocked := outbox_key_full(NEW.queue, NEW.ordering_key, NULL);
    RETURN NEW;
END
$$;

-- A task stopped or started needing its key (after the statement that
-- changed it, so one statement may change several tasks of a key):
-- a holder that let go hands the key on; a waiting task that left the
-- line (cancelled) drops its flag; a task back from the dead (an operator's
-- retry of a skipped task) queues again, in key order.
CREATE FUNCTION outbox_key_on_change() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NOT outbox_needs_key(NEW.state, NEW.dead_at, NEW.skip_dead) THEN
        IF OLD.blocked THEN
            UPDATE outbox_tasks SET blocked = false WHERE id = NEW.id;
        ELSE
            PERFORM outbox_key_advance(OLD.queue, OLD.ordering_key);
        END IF;
    ELSE
        PERFORM outbox_lock_key(NEW.queue, NEW.ordering_key);
        UPDATE outbox_tasks SET blocked = true WHERE id = NEW.id;
        PERFORM outbox_key_advance(NEW.queue, NEW.ordering_key);
    END IF;
    RETURN NULL;
END
$$;

-- A task that held its key was deleted.
CREATE FUNCTION outbox_key_on_delete() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM outbox_key_advance(OLD.queue, OLD.ordering_key);
    RETURN NULL;
END
$$;

-- Triggers fire only for tasks with a key, and only AFTER the row: a
-- BEFORE UPDATE trigger would make PostgreSQL lock every updated row of
-- the table first (claims and outcomes included), which measured 1.8x the
-- time of an outcome batch. The WHEN clauses keep updates that do not
-- change whether a task needs its key (claims, heartbeats, retries of a
-- head) out of PL/pgSQL; they spell out outbox_needs_key.
CREATE TRIGGER outbox_key_insert
    BEFORE INSERT ON outbox_tasks
    FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION outbox_key_on_insert();

CREATE TRIGGER outbox_key_change
    AFTER UPDATE OF state, dead_at, skip_dead ON outbox_tasks
    FOR EACH ROW WHEN (OLD.ordering_key IS NOT NULL
                       AND (OLD.state <> 'completed' AND (OLD.dead_at IS NULL OR NOT OLD.skip_dead))
                           IS DISTINCT FROM
                           (NEW.state <> 'completed' AND (NEW.dead_at IS NULL OR NOT NEW.skip_dead)))
    EXECUTE FUNCTION outbox_key_on_change();

CREATE TRIGGER outbox_key_delete
    AFTER DELETE ON outbox_tasks
    FOR EACH ROW WHEN (OLD.ordering_key IS NOT NULL AND NOT OLD.blocked
                       AND OLD.state <> 'completed' AND (OLD.dead_at IS NULL OR NOT OLD.skip_dead))
    EXECUTE FUNCTION outbox_key_on_delete();
