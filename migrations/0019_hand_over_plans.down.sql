-- Back to migration 17's outbox_keys_hand_on.
CREATE OR REPLACE FUNCTION outbox_keys_hand_on(q text[], k text[], hand_queues text[], hand_places integer[],
                                    token text, at timestamptz)
RETURNS TABLE (id bigint, queue text, claimed boolean, task_type text, payload text,
               retry_count integer, max_attempts integer, claims integer, key_seq bigint,
               created_at timestamptz, trace_context text)
LANGUAGE plpgsql
SET enable_seqscan = off
-- Planned once per session, not at every call: replanning the statements
-- below cost a hot key more than running them (1.75 against 1.1 ms an
-- outcome, measured on one key with 3,000 waiting). With sequential scans
-- off the one plan walks the same indexes whatever the sizes.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    wanted integer;
    locked integer;
    open_queues text[] := '{}';
    handed_ids bigint[];
    taken_ids bigint[];
    handed record;
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
        -- (Migration 8 ordered by `1 COLLATE "C"`, a constant rather than
        -- the first column, which PostgreSQL refuses: this path failed.)
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
    -- into arrays first, so that the UPDATE below finds them by primary key
    -- (joined to a CTE of unknown size, the planner would scan the key's
    -- whole backlog).
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
        SELECT w.id, w.queue,
               -- Startable by this worker now, if it has the place, and no
               -- claimable task of the queue is more urgent.
               w.queue = ANY (open_queues)
                   AND w.state IN ('pending', 'failed') AND w.dead_at IS NULL
                   AND w.execute_at <= coalesce(at, now())
                   AND NOT EXISTS (
                       SELECT 1 FROM outbox_tasks AS o
                       WHERE o.queue = w.queue
                         AND o.state IN ('pending', 'failed') AND o.dead_at IS NULL
                         AND NOT o.blocked AND o.execute_at <= coalesce(at, now())
                         AND o.priority < w.priority)
                   AS startable
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
    taken AS (
        SELECT next.id,
               next.startable AND row_number() OVER (
                   PARTITION BY next.queue, next.startable ORDER BY next.id
               ) <= coalesce(p.places, 0) AS take
        FROM next
        LEFT JOIN unnest(hand_queues, hand_places) AS p(name, places) ON p.name = next.queue
    )
    SELECT coalesce(array_agg(taken.id), '{}'),
           coalesce(array_agg(taken.id) FILTER (WHERE taken.take), '{}')
    INTO handed_ids, taken_ids
    FROM taken;
    FOR handed IN
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
        WHERE t.id = ANY (handed_ids) AND t.blocked
        RETURNING t.id, t.queue, t.id = ANY (taken_ids) AS claimed, t.task_type,
                  t.payload::text AS payload, t.retry_count, t.max_attempts, t.claims, t.key_seq,
                  t.created_at, t.trace_context
    LOOP
        IF NOT handed.claimed THEN
            -- Wakes the queue's workers at commit (PostgreSQL folds repeats
            -- within a transaction into one notification).
            PERFORM pg_notify('outbox_tasks', handed.queue);
        END IF;
        id := handed.id;
        queue := handed.queue;
        claimed := handed.claimed;
        task_type := handed.task_type;
        payload := handed.payload;
        retry_count := handed.retry_count;
        max_attempts := handed.max_attempts;
        claims := handed.claims;
        key_seq := handed.key_seq;
        created_at := handed.created_at;
        trace_context := handed.trace_context;
        RETURN NEXT;
    END LOOP;
END
$$;
