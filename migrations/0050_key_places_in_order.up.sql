-- A key's places are claimed in key order where it may run several tasks
-- at once (queues with a per-key concurrency above 1; issue 23, found by
-- an operator's walkthrough).
--
-- A task with a place that waits to be claimed (PENDING, not blocked, no
-- claim) is earlier in its key's line than any task still waiting for a
-- place. When a holder let go of such a key, the hand-over took the next
-- task for its own worker in the same statement, so that task was claimed
-- and started before the earlier one: a task given back at shutdown, or
-- one submitted with a free place a moment before. Now the next task is
-- handed its place and left to the claims, which take the earlier one
-- first. A key with one place is unchanged (no task can have a place
-- before the one handed it), and so is every hand-over's cost there: the
-- new probe is made only for keys that run several at once.
--
-- The same walkthrough's other half is in the worker: a queue whose keys
-- run several at once is claimed without a buffer ahead
-- (worker/claim_ahead.rs).

CREATE OR REPLACE FUNCTION outbox_keys_let_go(q text[], k text[], patience interval,
                                   hand_queues text[], hand_places integer[], token text,
                                   at timestamptz)
RETURNS TABLE (id bigint, queue text, claimed boolean, task_type text, payload text,
               retry_count integer, max_attempts integer, claims integer, key_seq bigint,
               created_at timestamptz, trace_context text, deferred_key text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    keys_q text[];
    keys_k text[];
    busy_q text[];
    busy_k text[];
    got integer;
    open_queues text[] := '{}';
    handed_ids bigint[];
    taken_ids bigint[];
    woken_queues text[];
BEGIN
    SELECT coalesce(array_agg(d.q), '{}'), coalesce(array_agg(d.k), '{}')
    INTO keys_q, keys_k
    FROM (SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL) AS d;
    IF cardinality(keys_k) = 0 THEN
        RETURN;
    END IF;
    IF patience IS NOT NULL THEN
        -- The usual case first, as cheaply as the lock itself: every row free.
        SELECT count(*) INTO got FROM (
            SELECT 1 FROM outbox_keys AS o
            WHERE (o.queue, o.ordering_key) IN (SELECT x.q, x.k FROM unnest(keys_q, keys_k) AS x(q, k))
            FOR UPDATE SKIP LOCKED) AS l;
        IF got < cardinality(keys_k) THEN
            -- Some row is held elsewhere or missing: wait as patience
            -- allows (the rows taken above are this transaction's and are
            -- taken again at once), hand on what was taken, return the rest.
            SELECT coalesce(array_agg(l.queue) FILTER (WHERE l.held), '{}'),
                   coalesce(array_agg(l.ordering_key) FILTER (WHERE l.held), '{}'),
                   coalesce(array_agg(l.queue) FILTER (WHERE l.held IS NOT TRUE), '{}'),
                   coalesce(array_agg(l.ordering_key) FILTER (WHERE l.held IS NOT TRUE), '{}')
            INTO keys_q, keys_k, busy_q, busy_k
            FROM outbox_keys_try_lock(keys_q, keys_k, patience) AS l;
            RETURN QUERY
            SELECT NULL::bigint, b.q, NULL::boolean, NULL::text, NULL::text, NULL::integer,
                   NULL::integer, NULL::integer, NULL::bigint, NULL::timestamptz, NULL::text, b.k
            FROM unnest(busy_q, busy_k) AS b(q, k);
            IF cardinality(keys_k) = 0 THEN
                RETURN;
            END IF;
        END IF;
    END IF;
    -- The hand-over (migration 23's outbox_keys_hand_on_held).
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
        SELECT x.q, x.k FROM unnest(keys_q, keys_k) AS x(q, k)
    ),
    room AS MATERIALIZED (
        SELECT keys.q, keys.k,
               -- An earlier task of the key has a place and waits to be
               -- claimed (given back at shutdown, say): the tasks handed a
               -- place here go to the claims' order behind it, not to this
               -- worker ahead of it. Only a key that runs several at once
               -- can have one (with one place, a task handed it had no
               -- holder before it); a CASE, so that the probe is certain
               -- not to run for those.
               CASE WHEN coalesce(s.per_key_concurrency, 1) > 1 THEN EXISTS (
                   SELECT 1 FROM outbox_tasks AS e
                   WHERE e.queue = keys.q AND e.ordering_key = keys.k
                     AND NOT e.blocked AND e.state = 'pending' AND e.claimed_by IS NULL
                     AND e.dead_at IS NULL) ELSE false END AS queued,
               coalesce(s.per_key_concurrency, 1) - (
                   SELECT count(*) FROM (
                       SELECT 1 FROM outbox_tasks AS h
                       WHERE h.queue = keys.q AND h.ordering_key = keys.k
                         AND h.ordering_key IS NOT NULL AND (NOT h.blocked OR h.state = 'processing')
                         AND h.state <> 'completed' AND (h.dead_at IS NULL OR NOT h.skip_dead)
                       LIMIT coalesce(s.per_key_concurrency, 1)) AS holders) AS free
        FROM keys LEFT JOIN outbox_queues AS s ON s.name = keys.q
    ),
    next AS MATERIALIZED (
        SELECT w.id, w.queue, w.priority,
               -- Startable by this worker now if it has the place and no
               -- claimable task of the queue is more urgent (below).
               w.queue = ANY (open_queues) AND NOT room.queued
                   AND w.state IN ('pending', 'failed') AND w.dead_at IS NULL
                   AND w.execute_at <= coalesce(at, now()) AS due
        FROM room, LATERAL (
            -- Only tasks that still need the key (belt and braces: a
            -- cancel takes a waiting task out of the line itself).
            SELECT t.id, t.queue, t.state, t.dead_at, t.execute_at, t.priority
            FROM outbox_tasks AS t
            WHERE t.queue = room.q AND t.ordering_key = room.k AND t.blocked
              AND t.state <> 'completed' AND (t.dead_at IS NULL OR NOT t.skip_dead)
              -- A run's task is claimed already (migration 28), held in
              -- place or not (migration 43).
              AND t.state <> 'processing' AND t.claimed_by IS NULL
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
              t.created_at, t.trace_context, NULL::text;
END
$$;
