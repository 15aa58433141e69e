-- outbox: ordering keys, queue settings for the whole cluster, and workers
-- that can be seen.

-- Tasks with the same ordering key in a queue run one at a time (or up to
-- the queue's per_key_concurrency), in the order of key_seq. A task that
-- may not run yet because earlier tasks of its key hold it is "blocked";
-- the flag is set by the insert trigger below and cleared when the task
-- ahead of it lets go of the key (outbox_keys_advance, called by the
-- engine's statements), so a claim never searches for earlier unfinished
-- tasks (which costs time in proportion to a hot key's backlog) but reads
-- the flag from its partial index.
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
-- get their key_seq in commit order. Maintenance deletes rows older than a
-- day of keys without unfinished tasks; ordering does not depend on a
-- row's age (key_seq comes from one sequence).
CREATE TABLE outbox_keys (
    queue        text NOT NULL,
    ordering_key text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
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
    rate_per_second     double precision CHECK (rate_per_second > 0 AND rate_per_second <= 1000000),
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

-- The functions below read the task table only through its partial key
-- indexes, and say so (enable_seqscan off): a plan cached while the table
-- was empty (or analyzed empty) would otherwise scan the whole table for
-- every task of a burst, which measured 30 times slower.

-- Whether a task in this state still needs its key (holding or waiting).
CREATE FUNCTION outbox_needs_key(state outbox_task_state, dead_at timestamptz, skip_dead boolean)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead) $$;

-- Takes the lock of key (q, k) until the end of the transaction, adding
-- the key's row if it has none. A row lock rather than an update: taking
-- it again in the same transaction (a batch with many tasks of one key)
-- writes nothing.
CREATE FUNCTION outbox_lock_key(q text, k text) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
    PERFORM 1 FROM outbox_keys WHERE queue = q AND ordering_key = k FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO outbox_keys (queue, ordering_key) VALUES (q, k)
        ON CONFLICT (queue, ordering_key) DO NOTHING;
        PERFORM 1 FROM outbox_keys WHERE queue = q AND ordering_key = k FOR UPDATE;
    END IF;
END
$$;

-- Whether a task of key (q, k) arriving now (or coming back) must wait:
-- the key's holders, task `self` left out, already fill its concurrency,
-- or earlier tasks are waiting. Call with the key's lock held.
CREATE FUNCTION outbox_key_full(q text, k text, self bigint) RETURNS boolean
LANGUAGE plpgsql
SET enable_seqscan = off
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

-- Hands each key (q[i], k[i]) to its next waiting tasks, as many as the
-- key's queue's per-key concurrency allows now, and wakes the workers of
-- the queues where a task became claimable; returns how many tasks it
-- handed a key to. Idempotent: a key without a free place or without
-- waiting tasks is left as it is.
--
-- The engine's statements that can make a task let go of its key (an
-- outcome, a recovery, a release, an operator's cancel or retry) call it
-- once, after every one of their rows is written, so that a statement
-- changing several tasks of one key has changed them all before any is
-- handed the key; maintenance calls it for every key with waiting tasks,
-- as the safety net for changes made behind the engine's back.
--
-- Two statements: the first takes the keys' locks (in byte order, the
-- order a batch submit writes them in, so two callers cannot deadlock), and the second, with a snapshot taken after
-- the locks, sees every task a submitter committed while holding one.
CREATE FUNCTION outbox_keys_advance(q text[], k text[]) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    wanted integer;
    locked integer;
    moved integer := 0;
    woken text;
BEGIN
    SELECT count(*) INTO wanted
    FROM (SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL) AS keys;
    IF wanted = 0 THEN
        RETURN 0;
    END IF;
    SELECT count(*) INTO locked FROM (
        SELECT 1 FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT x.q, x.k FROM unnest(q, k) AS x(q, k))
        ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
        FOR UPDATE) AS l;
    IF locked < wanted THEN
        -- Keys whose row maintenance removed meanwhile: add and lock them.
        INSERT INTO outbox_keys (queue, ordering_key)
        SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL
        ORDER BY 1 COLLATE "C", 2 COLLATE "C"
        ON CONFLICT (queue, ordering_key) DO NOTHING;
        PERFORM 1 FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT x.q, x.k FROM unnest(q, k) AS x(q, k))
        ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
        FOR UPDATE;
    END IF;
    FOR woken IN
        WITH keys AS (
            SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL
        ),
        room AS (
            SELECT keys.q, keys.k,
                   coalesce(s.per_key_concurrency, 1) - (
                       SELECT count(*) FROM (
                           SELECT 1 FROM outbox_tasks AS h
                           WHERE h.queue = keys.q AND h.ordering_key = keys.k
                             AND h.ordering_key IS NOT NULL AND NOT h.blocked
                             AND h.state <> 'completed' AND (h.dead_at IS NULL OR NOT h.skip_dead)
                           LIMIT coalesce(s.per_key_concurrency, 1)) AS holders) AS free
            FROM keys LEFT JOIN outbox_queues AS s ON s.name = keys.q
        ),
        next AS (
            SELECT w.id
            FROM room, LATERAL (
                -- Only tasks that still need the key (belt and braces: a
                -- cancel takes a waiting task out of the line itself).
                SELECT t.id FROM outbox_tasks AS t
                WHERE t.queue = room.q AND t.ordering_key = room.k AND t.blocked
                  AND t.state <> 'completed' AND (t.dead_at IS NULL OR NOT t.skip_dead)
                ORDER BY t.key_seq
                LIMIT greatest(room.free, 0)) AS w
            WHERE room.free > 0
        ),
        handed AS (
            UPDATE outbox_tasks AS t SET blocked = false
            FROM next
            WHERE t.id = next.id AND t.blocked
            RETURNING t.queue
        )
        SELECT queue FROM handed
    LOOP
        moved := moved + 1;
        -- Wakes the queue's workers at commit (PostgreSQL folds repeats
        -- within a transaction into one notification).
        PERFORM pg_notify('outbox_tasks', woken);
    END LOOP;
    RETURN moved;
END
$$;

-- One key: outbox_keys_advance for it alone.
CREATE FUNCTION outbox_key_advance(q text, k text) RETURNS integer
LANGUAGE sql
AS $$ SELECT outbox_keys_advance(ARRAY[q], ARRAY[k]) $$;

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

-- The one trigger: an insert with a key takes the key's lock and its place.
-- The hand-over is done by the engine's own statements (above) rather than
-- by UPDATE or DELETE triggers: a row trigger on UPDATE makes PostgreSQL
-- fetch (BEFORE: lock) every updated row of the table again, claims and
-- outcomes of tasks without a key included, which measured 20% of the
-- drain rate. The WHEN clause keeps tasks without a key out of PL/pgSQL.
CREATE TRIGGER outbox_key_insert
    BEFORE INSERT ON outbox_tasks
    FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION outbox_key_on_insert();
