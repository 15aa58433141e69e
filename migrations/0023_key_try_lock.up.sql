-- Outcomes no longer wait for an application's open transaction on an
-- ordering key.
--
-- A submit of a keyed task holds its key's row in outbox_keys until the
-- submitting transaction ends. An outcome batch that let go of that key
-- locked the row too (FOR UPDATE) and waited, with every other outcome of
-- its batch, of any queue, until the submitter ended or the statement
-- timed out; retried, it waited again, and an application transaction
-- left open on two keys stopped a worker's outcomes and then its claims.
--
-- outbox_keys_try_lock takes what it can of a set of keys' rows and says
-- of each key whether it is now held (true), held by another transaction
-- (false), or has no row (null). It takes the free rows without waiting
-- (SKIP LOCKED), then waits for the others, one key at a time in key
-- order, until `patience` has passed in all: the engine's own statements
-- hold a key for milliseconds (another outcome, maintenance's advance of
-- waiting keys), an application's open transaction for as long as it
-- likes. A key without a row (maintenance removed it) gets one within the
-- same patience; the insert waits for a transaction adding the same row.
-- A key not taken by then is left as it was found (each wait is a
-- subtransaction of its own, undone with its lock_timeout when it runs
-- out), and no wait can outlast the patience, so a statement that holds
-- other keys already never waits on an application while holding them.
--
-- An outcome hands on the keys it holds and returns the others to its
-- worker, which hands them on in statements of their own once they can be
-- taken (worker/deferred_keys.rs); a worker that dies first, or whose
-- outcome's reply was lost with the keys it owed, leaves them to
-- maintenance's advance of every waiting key (each cleanup).
CREATE FUNCTION outbox_keys_try_lock(q text[], k text[], patience interval)
RETURNS TABLE (queue text, ordering_key text, held boolean)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    wanted_q text[];
    wanted_k text[];
    taken boolean[];
    busy integer;
    deadline timestamptz;
    left_ms bigint;
    before text := current_setting('lock_timeout');
    i bigint;
    wanted integer;
    got integer;
BEGIN
    -- The usual case first, as cheaply as the lock itself: every row free.
    SELECT count(*) INTO wanted
    FROM (SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL) AS d;
    SELECT count(*) INTO got FROM (
        SELECT 1 FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT x.q, x.k FROM unnest(q, k) AS x(q, k))
        FOR UPDATE SKIP LOCKED) AS l;
    IF got = wanted THEN
        RETURN QUERY
        SELECT DISTINCT x.q, x.k, true FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL;
        RETURN;
    END IF;
    -- Some row is held elsewhere or missing: which (the rows taken above
    -- are this transaction's now, and taken again at once).
    WITH wanted AS (
        SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL
    ),
    locked AS (
        SELECT o.queue, o.ordering_key FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT w.q, w.k FROM wanted AS w)
        FOR UPDATE SKIP LOCKED
    )
    SELECT coalesce(array_agg(f.q), '{}'), coalesce(array_agg(f.k), '{}'),
           coalesce(array_agg(f.held), '{}'), count(*) FILTER (WHERE f.held IS NOT TRUE)
    INTO wanted_q, wanted_k, taken, busy
    FROM (SELECT w.q, w.k,
                 CASE WHEN l.queue IS NOT NULL THEN true
                      WHEN EXISTS (SELECT 1 FROM outbox_keys AS e
                                   WHERE e.queue = w.q AND e.ordering_key = w.k) THEN false
                 END AS held
          FROM wanted AS w
          LEFT JOIN locked AS l ON l.queue = w.q AND l.ordering_key = w.k) AS f;
    IF busy > 0 AND patience > interval '0' THEN
        deadline := clock_timestamp() + patience;
        -- In key order, as every statement that waits for keys takes them.
        FOR i IN SELECT t.i FROM unnest(wanted_q, wanted_k, taken) WITH ORDINALITY AS t(q, k, held, i)
                 WHERE t.held IS NOT TRUE
                 ORDER BY t.q COLLATE "C", t.k COLLATE "C" LOOP
            left_ms := floor(extract(epoch FROM deadline - clock_timestamp()) * 1000);
            EXIT WHEN left_ms < 1;
            BEGIN
                PERFORM set_config('lock_timeout', left_ms::text || 'ms', true);
                IF taken[i] IS NULL THEN
                    INSERT INTO outbox_keys (queue, ordering_key) VALUES (wanted_q[i], wanted_k[i])
                    ON CONFLICT (queue, ordering_key) DO NOTHING;
                END IF;
                PERFORM 1 FROM outbox_keys AS o
                WHERE o.queue = wanted_q[i] AND o.ordering_key = wanted_k[i]
                FOR UPDATE;
                IF FOUND THEN
                    taken[i] := true;
                END IF;
                PERFORM set_config('lock_timeout', before, true);
            EXCEPTION WHEN lock_not_available THEN
                -- Held for longer than the patience: left to the caller.
                NULL;
            END;
        END LOOP;
    END IF;
    RETURN QUERY
    SELECT t.q, t.k, t.held FROM unnest(wanted_q, wanted_k, taken) AS t(q, k, held);
END
$$;

-- The hand-over itself, for keys the caller holds already (outcomes take
-- theirs with outbox_keys_try_lock): migration 19's outbox_keys_hand_on
-- without its first step, which locked the keys again (a second lock of
-- the same rows cost the outcome of 200 keys about 0.9 ms).
CREATE FUNCTION outbox_keys_hand_on_held(q text[], k text[], hand_queues text[],
                                         hand_places integer[], token text,
                                         at timestamptz)
RETURNS TABLE (id bigint, queue text, claimed boolean, task_type text, payload text,
               retry_count integer, max_attempts integer, claims integer, key_seq bigint,
               created_at timestamptz, trace_context text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    wanted integer;
    open_queues text[] := '{}';
    handed_ids bigint[];
    taken_ids bigint[];
    woken_queues text[];
BEGIN
    SELECT count(*) INTO wanted
    FROM (SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL) AS keys;
    IF wanted = 0 THEN
        RETURN;
    END IF;
    IF token IS NOT NULL AND cardinality(hand_queues) > 0 THEN
        -- The queues that may take a hand-on now. A queue without a row has
        -- no limits (as for the plain claim).
        PERFORM 1 FROM outbox_queues AS s WHERE s.name = ANY (hand_queues) FOR SHARE;
        SELECT coalesce(array_agg(h.name), '{}') INTO open_queues
        FROM unnest(hand_queues) AS h(name)
        WHERE NOT EXISTS (
            SELECT 1 FROM outbox_queues AS s
            WHERE s.name = h.name
              AND (s.paused_at IS NOT NULL OR s.global_concurrency IS NOT NULL
                   OR s.rate_per_second IS NOT NULL));
    END IF;
    -- Which tasks get their key, and which of them this worker takes. Read
    -- into arrays first, so that the UPDATE below finds them by primary key.
    WITH keys AS (
        SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL
    ),
    room AS MATERIALIZED (
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
    next AS MATERIALIZED (
        SELECT w.id, w.queue, w.priority,
               -- Startable by this worker now if it has the place and no
               -- claimable task of the queue is more urgent (below).
               w.queue = ANY (open_queues)
                   AND w.state IN ('pending', 'failed') AND w.dead_at IS NULL
                   AND w.execute_at <= coalesce(at, now()) AS due
        FROM room, LATERAL (
            -- Only tasks that still need the key (belt and braces: a
            -- cancel takes a waiting task out of the line itself).
            SELECT t.id, t.queue, t.state, t.dead_at, t.execute_at, t.priority
            FROM outbox_tasks AS t
            WHERE t.queue = room.q AND t.ordering_key = room.k AND t.blocked
              AND t.state <> 'completed' AND (t.dead_at IS NULL OR NOT t.skip_dead)
            ORDER BY t.key_seq
            LIMIT greatest(room.free, 0)) AS w
        WHERE room.free > 0
    ),
    -- Whether a claimable task of the queue is more urgent than a given
    -- priority: asked once per queue and priority among the due tasks,
    -- not once per task.
    urgent AS (
        SELECT g.queue, g.priority,
               EXISTS (
                   SELECT 1 FROM outbox_tasks AS o
                   WHERE o.queue = g.queue
                     AND o.state IN ('pending', 'failed') AND o.dead_at IS NULL
                     AND NOT o.blocked AND o.execute_at <= coalesce(at, now())
                     AND o.priority < g.priority) AS beaten
        FROM (SELECT DISTINCT next.queue, next.priority FROM next WHERE next.due) AS g
    ),
    taken AS (
        SELECT next.id, next.queue,
               coalesce(next.due AND NOT u.beaten, false) AND row_number() OVER (
                   PARTITION BY next.queue, coalesce(next.due AND NOT u.beaten, false)
                   ORDER BY next.id
               ) <= coalesce(p.places, 0) AS take
        FROM next
        LEFT JOIN urgent AS u ON u.queue = next.queue AND u.priority = next.priority
        LEFT JOIN unnest(hand_queues, hand_places) AS p(name, places) ON p.name = next.queue
    )
    SELECT coalesce(array_agg(taken.id), '{}'),
           coalesce(array_agg(taken.id) FILTER (WHERE taken.take), '{}'),
           coalesce(array_agg(DISTINCT taken.queue) FILTER (WHERE NOT taken.take), '{}')
    INTO handed_ids, taken_ids, woken_queues
    FROM taken;
    IF cardinality(handed_ids) = 0 THEN
        RETURN;
    END IF;
    -- Wakes those queues' workers at commit.
    PERFORM pg_notify('outbox_tasks', w.name) FROM unnest(woken_queues) AS w(name);
    RETURN QUERY
    UPDATE outbox_tasks AS t
    SET blocked = false,
        state = CASE WHEN t.id = ANY (taken_ids) THEN 'processing' ELSE t.state END,
        claims = t.claims + CASE WHEN t.id = ANY (taken_ids) THEN 1 ELSE 0 END,
        claimed_by = CASE WHEN t.id = ANY (taken_ids) THEN token ELSE t.claimed_by END,
        heartbeat_at = CASE WHEN t.id = ANY (taken_ids) THEN coalesce(at, now())
                            ELSE t.heartbeat_at END,
        attempted_at = CASE WHEN t.id = ANY (taken_ids) THEN coalesce(at, clock_timestamp())
                            ELSE t.attempted_at END,
        updated_at = CASE WHEN t.id = ANY (taken_ids) THEN coalesce(at, now())
                          ELSE t.updated_at END
    WHERE t.id = ANY (handed_ids) AND t.blocked IS TRUE
    RETURNING t.id, t.queue, t.id = ANY (taken_ids), t.task_type,
              t.payload::text, t.retry_count, t.max_attempts, t.claims, t.key_seq,
              t.created_at, t.trace_context;
END
$$;

-- Every other caller (failures, cancels, recovery, the SQL API) goes on
-- calling outbox_keys_hand_on or outbox_keys_advance, which lock the keys
-- and wait for them as before.
CREATE OR REPLACE FUNCTION outbox_keys_hand_on(q text[], k text[], hand_queues text[],
                                               hand_places integer[], token text,
                                               at timestamptz)
RETURNS TABLE (id bigint, queue text, claimed boolean, task_type text, payload text,
               retry_count integer, max_attempts integer, claims integer, key_seq bigint,
               created_at timestamptz, trace_context text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    wanted integer;
    locked integer;
BEGIN
    SELECT count(*) INTO wanted
    FROM (SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL) AS keys;
    IF wanted = 0 THEN
        RETURN;
    END IF;
    SELECT count(*) INTO locked FROM (
        SELECT 1 FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT x.q, x.k FROM unnest(q, k) AS x(q, k))
        ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
        FOR UPDATE) AS l;
    IF locked < wanted THEN
        -- Keys whose row maintenance removed meanwhile: add and lock them.
        INSERT INTO outbox_keys (queue, ordering_key)
        SELECT d.q, d.k
        FROM (SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL) AS d
        ORDER BY d.q COLLATE "C", d.k COLLATE "C"
        ON CONFLICT (queue, ordering_key) DO NOTHING;
        PERFORM 1 FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT x.q, x.k FROM unnest(q, k) AS x(q, k))
        ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
        FOR UPDATE;
    END IF;
    RETURN QUERY SELECT * FROM outbox_keys_hand_on_held(q, k, hand_queues, hand_places, token, at);
END
$$;
