-- Outcomes planned once per session, and ordering keys let go of in one
-- call.
--
-- 1. outbox_keys_let_go takes the rows of the keys an outcome let go of,
-- hands the keys it took on to their next tasks (claiming them for the
-- caller when it offers places), and returns the keys it could not take,
-- one row each with deferred_key set. Since migration 23 an outcome made
-- two calls for this (the try-lock, then the hand-over of what it held),
-- and with them a second count of its keys, a third query to return the
-- try-lock's answer and the statement's own aggregation between the two.
-- The usual case, every row free, is now one SKIP LOCKED query before the
-- hand-over; the try-lock with its patience runs only when some row was
-- held elsewhere or missing, as before. patience NULL: the caller holds
-- the keys' rows already, nothing is locked here (outbox_keys_hand_on
-- locks and waits, then calls this through outbox_keys_hand_on_held).
--
-- 2. The outcome statements themselves (success, retention zero, and every
-- other outcome) run in functions that keep one generic plan: see
-- outbox_complete_tasks below for why.
CREATE FUNCTION outbox_keys_let_go(q text[], k text[], patience interval,
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
              t.created_at, t.trace_context, NULL::text;
END
$$;

-- The hand-over of keys the caller holds, for outbox_keys_hand_on (the
-- failures, cancels, recovery and SQL API that lock and wait for their
-- keys): the same as before, now the one above with no lock step.
-- PL/pgSQL, like its callers, so that its one query keeps its plan.
CREATE OR REPLACE FUNCTION outbox_keys_hand_on_held(q text[], k text[], hand_queues text[],
                                                    hand_places integer[], token text,
                                                    at timestamptz)
RETURNS TABLE (id bigint, queue text, claimed boolean, task_type text, payload text,
               retry_count integer, max_attempts integer, claims integer, key_seq bigint,
               created_at timestamptz, trace_context text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    SELECT l.id, l.queue, l.claimed, l.task_type, l.payload, l.retry_count, l.max_attempts,
           l.claims, l.key_seq, l.created_at, l.trace_context
    FROM outbox_keys_let_go(q, k, NULL::interval, hand_queues, hand_places, token, at) AS l;
END
$$;

-- The success outcomes (the worker's fast path, complete_tasks.sql and
-- delete_completed_tasks.sql) run in a function that plans its statement
-- once per session.
--
-- Sent by the client, an outcome statement was planned per call whenever
-- PostgreSQL's plan cache judged a custom plan cheaper: it compares the
-- generic plan's cost with the custom plans' cost plus an allowance for
-- planning, which grows with the number of tables, subqueries and CTEs in
-- the statement. For a batch of one task (a hot key runs one task per
-- outcome; a quiet queue too) the generic plan, which assumes ten, costs
-- more by about as much as that allowance: the retention-zero statement
-- and the statement of every other outcome (finish_tasks.sql) were planned
-- afresh for each such batch (about 0.6 ms a plan, more than the statement
-- took to run), and the success statement tipped over too once the key
-- calls above were folded into one. Behind a transaction-mode pooler, where
-- the engine drops its prepared statements after each call, every outcome
-- was planned. Here the plan is generic, always (and kept by the server
-- session behind a pooler), and sequential scans are off so that a plan
-- made while the table looked empty still finds the batch by primary key.
--
-- attempt_ids, attempt_claims and attempt_tokens: the batch, fenced on
-- claims and claim token; clock overrides the clock (tests); hand_queues,
-- hand_places and hand_token: the hand-on offer (complete_tasks.sql says
-- what the rows returned are); delete_all: retention zero, the tasks are
-- deleted without history (delete_completed_tasks.sql).
CREATE FUNCTION outbox_complete_tasks(attempt_ids bigint[], attempt_claims integer[],
                                      attempt_tokens text[], clock timestamptz,
                                      hand_queues text[], hand_places integer[],
                                      hand_token text, delete_all boolean)
RETURNS TABLE (id bigint, handed boolean, claimed boolean, queue text, task_type text,
               payload text, retry_count integer, max_attempts integer, claims integer,
               key_seq bigint, created_at timestamptz, trace_context text, ordered boolean,
               workflow_id bigint, deferred_key text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    IF delete_all THEN
        RETURN QUERY
        WITH batch AS (
            SELECT t.id, t.cancel_requested_at IS NOT NULL AS cancelled
            FROM outbox_tasks AS t
            JOIN unnest(attempt_ids, attempt_claims, attempt_tokens) AS o(id, claims, token)
              ON t.id = o.id
            WHERE t.claims = o.claims
              -- The claim token is unique to the claim statement (only PROCESSING
              -- rows have one: a CHECK constraint says so).
              AND t.claimed_by = o.token
            -- Locked in id order, as the heartbeat's UPDATE takes them: in the
            -- order of the batch, the two deadlocked (found after 1 s, the
            -- heartbeat retried late, and recovery took live tasks).
            ORDER BY t.id
            FOR UPDATE OF t
        ),
        gone AS (
            DELETE FROM outbox_tasks AS t
            USING batch
            WHERE t.id = batch.id AND NOT batch.cancelled
            RETURNING t.id, t.queue, t.ordering_key
        ),
        cancelled AS (
            UPDATE outbox_tasks AS t
            SET state = 'failed',
                dead_at = now(),
                finished_at = now(),
                last_error = 'cancelled by an operator',
                claimed_by = NULL,
                heartbeat_at = NULL,
                updated_at = now()
            FROM batch
            WHERE t.id = batch.id AND batch.cancelled
            RETURNING t.id, t.queue, t.ordering_key
        ),
        handed AS (
            -- Every one of them let go of its ordering key (a cancelled task is
            -- skipped): the key goes on, after every row above is written, if its
            -- row can be taken soon enough (as in complete_tasks.sql).
            SELECT l.*
            FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k
                  FROM (SELECT queue, ordering_key FROM gone
                        UNION ALL
                        SELECT queue, ordering_key FROM cancelled) AS k
                  WHERE ordering_key IS NOT NULL
                  HAVING count(*) > 0) AS released,
                 LATERAL outbox_keys_let_go(released.q, released.k, interval '50 milliseconds',
                                            hand_queues, hand_places, hand_token, clock) AS l
        )
        SELECT id, false AS handed, NULL::bool AS claimed, NULL::text AS queue, NULL::text AS task_type,
               NULL::text AS payload, NULL::int AS retry_count, NULL::int AS max_attempts,
               NULL::int AS claims, NULL::bigint AS key_seq, NULL::timestamptz AS created_at,
               NULL::text AS trace_context, NULL::bool AS ordered, NULL::bigint AS workflow_id,
               NULL::text AS deferred_key
        FROM gone
        UNION ALL
        SELECT id, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
        FROM cancelled
        UNION ALL
        SELECT id, true, claimed, queue, task_type, payload, retry_count, max_attempts, claims, key_seq,
               created_at, trace_context, true, NULL, NULL
        FROM handed WHERE deferred_key IS NULL
        UNION ALL
        SELECT NULL, true, false, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               deferred_key
        FROM handed WHERE deferred_key IS NOT NULL;
    ELSE
        RETURN QUERY
        WITH batch AS (
            -- Locked first, so that what decides a row's fate is its latest version
            -- (a cancel committed meanwhile is seen), and the DELETE and UPDATE
            -- below split the batch between them exactly.
            SELECT t.id,
                   t.cancel_requested_at IS NOT NULL AS cancelled,
                   coalesce(t.unique_states & 8, 0) <> 0 AS covers_completed
            FROM outbox_tasks AS t
            JOIN unnest(attempt_ids, attempt_claims, attempt_tokens) AS o(id, claims, token)
              ON t.id = o.id
            WHERE t.claims = o.claims
              -- The claim token is unique to the claim statement (only PROCESSING
              -- rows have one: a CHECK constraint says so). Testing claimed_by rather
              -- than state keeps the planner from walking outbox_tasks_processing_idx
              -- and re-scanning the batch for every row.
              AND t.claimed_by = o.token
            -- Locked in id order, as the heartbeat's UPDATE takes them: in the
            -- order of the batch, the two deadlocked (found after 1 s, the
            -- heartbeat retried late, and recovery took live tasks).
            ORDER BY t.id
            FOR UPDATE OF t
        ),
        gone AS (
            DELETE FROM outbox_tasks AS t
            USING batch
            WHERE t.id = batch.id AND NOT batch.cancelled AND NOT batch.covers_completed
            RETURNING t.*
        ),
        archived AS (
            INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                             max_attempts, claims, execute_at, created_at, attempted_at,
                                             finished_at, last_error, result, unique_key, ordering_key,
                                             key_seq)
            SELECT id, task_type, queue, payload, priority, retry_count, max_attempts, claims,
                   execute_at, created_at, attempted_at, coalesce(clock, clock_timestamp()), last_error,
                   NULL, unique_key, ordering_key, key_seq
            FROM gone
        ),
        kept AS (
            UPDATE outbox_tasks AS t
            SET state = CASE WHEN batch.cancelled THEN 'failed' ELSE 'completed' END::outbox_task_state,
                -- An operator asked to cancel it: it ends dead, whatever it returned.
                dead_at = CASE WHEN batch.cancelled THEN coalesce(clock, clock_timestamp()) END,
                last_error = CASE WHEN batch.cancelled THEN 'cancelled by an operator' ELSE t.last_error END,
                finished_at = coalesce(clock, clock_timestamp()),
                claimed_by = NULL,
                heartbeat_at = NULL,
                updated_at = coalesce(clock, now())
            FROM batch
            WHERE t.id = batch.id AND (batch.cancelled OR batch.covers_completed)
            RETURNING t.id, t.queue, t.ordering_key, t.state, t.dead_at, t.skip_dead
        ),
        handed AS (
            -- Tasks that let go of their ordering key hand it on (after every row
            -- above is written: the aggregate reads them all first), if its row can
            -- be taken soon enough. A task gone to the history has let go of it.
            SELECT l.*
            FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k
                  FROM (SELECT queue, ordering_key FROM gone
                        UNION ALL
                        SELECT queue, ordering_key FROM kept
                        WHERE NOT (state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead))) AS k
                  WHERE ordering_key IS NOT NULL
                  HAVING count(*) > 0) AS released,
                 LATERAL outbox_keys_let_go(released.q, released.k, interval '50 milliseconds',
                                            hand_queues, hand_places, hand_token, clock) AS l
        )
        SELECT id, false AS handed, NULL::bool AS claimed, NULL::text AS queue, NULL::text AS task_type,
               NULL::text AS payload, NULL::int AS retry_count, NULL::int AS max_attempts,
               NULL::int AS claims, NULL::bigint AS key_seq, NULL::timestamptz AS created_at,
               NULL::text AS trace_context, NULL::bool AS ordered, NULL::bigint AS workflow_id,
               NULL::text AS deferred_key
        FROM gone
        UNION ALL
        SELECT id, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
        FROM kept
        UNION ALL
        SELECT id, true, claimed, queue, task_type, payload, retry_count, max_attempts, claims, key_seq,
               created_at, trace_context, true, NULL, NULL
        FROM handed WHERE deferred_key IS NULL
        UNION ALL
        SELECT NULL, true, false, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               deferred_key
        FROM handed WHERE deferred_key IS NOT NULL;
    END IF;
END
$$;

-- Every other outcome (failures, retries, results: finish_tasks.sql) runs
-- in a function for the same reason: for a batch of one, its custom plans
-- looked cheaper than its generic one by more than the planning allowance,
-- so each failure was planned afresh.
--
-- Each array holds one value per attempt: its id, claims and claim token
-- (the fence), its new state ('completed', 'failed' or 'pending'), what to
-- add to retry_count, the delay before its next attempt in microseconds,
-- whether it is dead, its error (null keeps the previous one) and its
-- result (JSON; null keeps none); clock overrides the clock (tests).
CREATE FUNCTION outbox_finish_tasks(attempt_ids bigint[], attempt_claims integer[],
                                    attempt_tokens text[], new_states text[],
                                    add_retries integer[], delays_us bigint[], deads boolean[],
                                    errors text[], clock timestamptz, results text[])
RETURNS TABLE (id bigint, queue text, deferred_key text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH batch AS (
        -- Locked first, so that what decides a row's fate is its latest version
        -- and the DELETE and UPDATE below split the batch between them exactly.
        SELECT t.id, o.state, o.add_retry, o.delay_us, o.dead, o.error, o.result,
               t.cancel_requested_at IS NOT NULL AS cancelled,
               o.state = 'completed' AND t.cancel_requested_at IS NULL
                   AND coalesce(t.unique_states & 8, 0) = 0 AS archive
        FROM outbox_tasks AS t
        JOIN unnest(attempt_ids, attempt_claims, attempt_tokens, new_states, add_retries, delays_us,
                    deads, errors, results)
             AS o(id, claims, token, state, add_retry, delay_us, dead, error, result)
          ON t.id = o.id
        WHERE t.claims = o.claims
          -- The claim token is unique to the claim statement (only PROCESSING rows
          -- have one: a CHECK constraint says so). Testing claimed_by rather than
          -- state keeps the planner from walking outbox_tasks_processing_idx and
          -- re-scanning the batch for every row.
          AND t.claimed_by = o.token
        -- Locked in id order, as the heartbeat's UPDATE takes them: in the
        -- order of the batch, the two deadlocked (found after 1 s, the
        -- heartbeat retried late, and recovery took live tasks).
        ORDER BY t.id
        FOR UPDATE OF t
    ),
    gone AS (
        DELETE FROM outbox_tasks AS t
        USING batch
        WHERE t.id = batch.id AND batch.archive
        RETURNING t.*, batch.result AS new_result
    ),
    archived AS (
        INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                         max_attempts, claims, execute_at, created_at, attempted_at,
                                         finished_at, last_error, result, unique_key, ordering_key,
                                         key_seq)
        SELECT id, task_type, queue, payload, priority, retry_count, max_attempts, claims,
               execute_at, created_at, attempted_at, coalesce(clock, clock_timestamp()), last_error,
               new_result::jsonb, unique_key, ordering_key, key_seq
        FROM gone
    ),
    kept AS (
        UPDATE outbox_tasks AS t
        SET state = CASE WHEN o.cancelled THEN 'failed' ELSE o.state::outbox_task_state END,
            retry_count = t.retry_count + o.add_retry,
            execute_at = CASE WHEN o.state = 'completed' OR o.cancelled THEN t.execute_at
                              ELSE coalesce(clock, now()) + o.delay_us * interval '1 microsecond' END,
            dead_at = CASE WHEN o.dead OR o.cancelled THEN coalesce(clock, clock_timestamp()) END,
            last_error = CASE WHEN o.cancelled THEN 'cancelled by an operator'
                              ELSE coalesce(o.error, t.last_error) END,
            result = CASE WHEN NOT o.cancelled THEN o.result::jsonb END,
            finished_at = CASE WHEN o.state = 'pending' AND NOT o.cancelled THEN NULL
                               ELSE coalesce(clock, clock_timestamp()) END,
            claimed_by = NULL,
            heartbeat_at = NULL,
            updated_at = coalesce(clock, now())
        FROM batch AS o
        WHERE t.id = o.id AND NOT o.archive
        RETURNING t.id, t.queue, t.ordering_key, t.state, t.dead_at, t.skip_dead
    ),
    handed AS (
        -- Tasks that let go of their ordering key hand it on (after every row
        -- above is written: the aggregate reads them all first), if its row can
        -- be taken soon enough. A task gone to the history has let go of it.
        -- Materialized (the function is volatile) and read whole below.
        SELECT l.queue, l.deferred_key
        FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k
              FROM (SELECT queue, ordering_key FROM gone
                    UNION ALL
                    SELECT queue, ordering_key FROM kept
                    WHERE NOT (state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead))) AS k
              WHERE ordering_key IS NOT NULL
              HAVING count(*) > 0) AS released,
             LATERAL outbox_keys_let_go(released.q, released.k, interval '50 milliseconds',
                                        '{}'::text[], '{}'::int[], NULL::text,
                                        NULL::timestamptz) AS l
    )
    SELECT id, NULL::text AS queue, NULL::text AS deferred_key FROM gone
    UNION ALL
    SELECT id, NULL, NULL FROM kept
    UNION ALL
    SELECT NULL, queue, deferred_key FROM handed WHERE deferred_key IS NOT NULL;
END
$$;

-- The claim of a queue with a global concurrency or a rate, in one call:
-- the queue's row is locked, then the claim runs with a snapshot taken
-- after the lock (a statement of its own), so it counts every claim
-- committed before it. It was two statements in a transaction of the
-- worker's (four round trips), and the second, sent by the client, was
-- planned for every call: its custom plans looked cheaper than its generic
-- one by more than the planning allowance (see outbox_complete_tasks).
-- claim_queue, wanted (at most), claim_token, at (overrides the clock,
-- tests). Returns what claim_limited.sql says.
CREATE FUNCTION outbox_claim_limited(claim_queue text, wanted bigint, claim_token text,
                                     at timestamptz)
RETURNS TABLE (id bigint, task_type text, queue text, payload text, retry_count integer,
               max_attempts integer, claims integer, ordered boolean, key_seq bigint,
               created_at timestamptz, trace_context text, workflow_id bigint,
               allowed bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
-- The count of running tasks reads the processing index, whose entries of
-- tasks finished since the last vacuum are dead. A bitmap scan never marks
-- them so, and each claim visited all of them (13,547 for 12 running,
-- 2.7 ms, in a drain of 50,000); a plain index scan marks each one once no
-- snapshot can see its task, and the claims after it skip them.
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    locked_at timestamptz;
BEGIN
    -- Claims of the queue run one at a time across the cluster (each
    -- counts what the one before it claimed) and wait for unlimited
    -- claims still in flight.
    PERFORM 1 FROM outbox_queues AS s WHERE s.name = claim_queue FOR UPDATE;
    locked_at := coalesce(at, clock_timestamp());
    RETURN QUERY
    WITH async_commit AS (
        SELECT set_config('synchronous_commit', 'off', true)
    ),
    -- The bucket's clock is the moment the queue's lock was granted, never
    -- earlier than its last refill: the statement's or the transaction's
    -- start would be before the lock wait, and count refill time twice.
    clock AS (
        SELECT locked_at AS now
    ),
    q AS (
        SELECT global_concurrency,
               rate_per_second,
               CASE WHEN rate_per_second IS NOT NULL THEN
                   least(greatest(1, rate_per_second / 10),
                         coalesce(rate_tokens, greatest(1, rate_per_second / 10))
                         + rate_per_second
                           * greatest(0, extract(epoch FROM clock.now - coalesce(rate_filled_at, clock.now)))::float8)
               END AS tokens,
               CASE WHEN rate_per_second IS NOT NULL THEN
                   greatest(clock.now, coalesce(rate_filled_at, clock.now))
               END AS filled_at
        FROM outbox_queues, clock
        WHERE name = claim_queue AND paused_at IS NULL
    ),
    running AS (
        SELECT count(*) AS n FROM outbox_tasks WHERE queue = claim_queue AND state = 'processing'
    ),
    allowed AS (
        SELECT greatest(0, least(wanted,
                                 coalesce(q.global_concurrency - running.n, wanted),
                                 coalesce(floor(q.tokens)::bigint, wanted))) AS n
        FROM q, running
    ),
    next AS (
        SELECT id
        FROM outbox_tasks
        WHERE queue = claim_queue
          AND state IN ('pending', 'failed') AND dead_at IS NULL AND NOT blocked
          AND execute_at <= coalesce(at, now())
        ORDER BY priority, execute_at, id
        LIMIT coalesce((SELECT n FROM allowed), 0)
        FOR UPDATE SKIP LOCKED
    ),
    claimed AS (
        UPDATE outbox_tasks AS t
        SET state = 'processing',
            claims = t.claims + 1,
            claimed_by = claim_token,
            heartbeat_at = coalesce(at, now()),
            attempted_at = coalesce(at, clock_timestamp()),
            updated_at = coalesce(at, now())
        FROM next, async_commit
        WHERE t.id = next.id
        RETURNING t.id, t.task_type, t.queue, t.payload::text AS payload,
                  t.retry_count, t.max_attempts, t.claims,
              t.ordering_key IS NOT NULL AS ordered, t.key_seq, t.created_at, t.trace_context,
                  t.workflow_id
    ),
    spent AS (
        UPDATE outbox_queues
        SET rate_tokens = (SELECT tokens FROM q) - (SELECT count(*) FROM claimed),
            rate_filled_at = (SELECT filled_at FROM q)
        WHERE name = claim_queue AND (SELECT tokens FROM q) IS NOT NULL
    )
    SELECT c.*, a.n AS allowed
    FROM allowed AS a
    LEFT JOIN claimed AS c ON true;
END
$$;
