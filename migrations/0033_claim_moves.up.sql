-- The claims move the intake themselves (issue 23). Migration 31 wrapped
-- the claim bodies of migrations 27 and 28 in new functions that moved
-- the intake, then returned the body's rows: every claimed row crossed
-- two set-returning PL/pgSQL calls, each materialising it (its payload
-- too), and each call saved and restored its own settings. pgbench, one
-- client, claims of 100 tasks rolled back: 1.17-1.36 ms through the
-- wrapper, 1.03-1.31 ms calling the body, 1.07-1.26 ms for a body with
-- the move at its start, alternating rounds (PERFORMANCE.md, "The claim
-- without its wrapper").
--
-- The claim functions' new signatures (migration 31) now are the bodies
-- of migrations 28 and 27 with the move as their first step, unchanged
-- otherwise (but that the plain claim of a paused or limited queue goes
-- on with nothing to claim, instead of returning at once, so as to say
-- how far its move went in one place). The old signatures still call the
-- new ones. outbox_take_intake calls the mover only when it locked rows,
-- so a claim beside an empty intake makes one small call (pgbench, claims
-- of 5: 0.42-0.49 ms against 0.43-0.55 ms with the move written inline).
-- outbox_claim_tasks_body and outbox_claim_limited_body stay for the down
-- file; nothing calls them.

-- Migration 31's, but the mover is called only when there is something to
-- move.
CREATE OR REPLACE FUNCTION outbox_take_intake(wanted bigint, above bigint, own_queue text)
RETURNS bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    ids bigint[] := ARRAY(SELECT x.id FROM outbox_intake AS x
                          WHERE x.id > above
                          ORDER BY x.id LIMIT wanted
                          FOR UPDATE SKIP LOCKED);
BEGIN
    IF cardinality(ids) = 0 THEN
        RETURN NULL;
    END IF;
    RETURN outbox_take_intake_ids(ids, own_queue);
END
$$;

CREATE OR REPLACE FUNCTION outbox_claim_tasks(q text, n bigint, token text, clock timestamptz,
                                   floor_priority smallint, floor_execute_at timestamptz,
                                   floor_id bigint, front_execute_at timestamptz,
                                   front_id bigint, run_length integer, intake_above bigint)
RETURNS TABLE (id bigint, task_type text, queue text, payload text, retry_count integer,
               max_attempts integer, claims integer, ordered boolean, key_seq bigint,
               created_at timestamptz, trace_context text, priority smallint,
               execute_at timestamptz, workflow_id bigint, follows boolean,
               ordering_key text, intake_to bigint)
LANGUAGE plpgsql
-- No JIT: a plan that has to use a node the settings below disable
-- costs 10^10, above jit_above_cost, and is compiled on every call (a
-- claim that sorted its rows took 0.6 s).
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    head_ids bigint[];
    -- The keyed ones among them, with their keys and places in them.
    keyed_ids bigint[];
    keyed_keys text[];
    keyed_seqs bigint[];
    follower_ids bigint[] := '{}';
    moved_to bigint;
BEGIN
    -- First the intake (migration 31): up to 1,000 committed tasks above
    -- intake_above, whatever their queue, so that this claim sees them.
    IF intake_above IS NOT NULL THEN
        moved_to := outbox_take_intake(1000, intake_above, q);
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    -- An operator's pause or limit waits for this claim; one that
    -- committed first is seen.
    PERFORM 1 FROM outbox_queues AS o
    WHERE o.name = q
      AND o.paused_at IS NULL AND o.global_concurrency IS NULL AND o.rate_per_second IS NULL
    FOR SHARE;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM outbox_queues AS o WHERE o.name = q) THEN
        -- Paused or limited: this claim takes nothing (migration 28
        -- returned here), but still says how far its move went, below.
        n := 0;
    END IF;
    WITH next AS (
        (SELECT r.* FROM (
         SELECT t.id, t.ordering_key, t.key_seq
         FROM outbox_tasks AS t
         WHERE t.queue = q
           AND t.state IN ('pending', 'failed') AND t.dead_at IS NULL AND NOT t.blocked
           AND t.execute_at <= coalesce(clock, now())
           AND t.priority < floor_priority
         ORDER BY t.priority, t.execute_at, t.id
         LIMIT n
         FOR UPDATE SKIP LOCKED) AS r)
        UNION ALL
        (SELECT r.* FROM (
         SELECT t.id, t.ordering_key, t.key_seq
         FROM outbox_tasks AS t
         WHERE t.queue = q
           AND t.state IN ('pending', 'failed') AND t.dead_at IS NULL AND NOT t.blocked
           AND t.execute_at <= coalesce(clock, now())
           AND (t.priority, t.execute_at, t.id) > (floor_priority, floor_execute_at, floor_id)
         ORDER BY t.priority, t.execute_at, t.id
         LIMIT n
         FOR UPDATE SKIP LOCKED) AS r)
        UNION ALL
        (SELECT r.* FROM (
         SELECT t.id, t.ordering_key, t.key_seq
         FROM outbox_tasks AS t
         WHERE t.queue = q
           AND t.state IN ('pending', 'failed') AND t.dead_at IS NULL AND NOT t.blocked
           AND t.execute_at <= coalesce(clock, now())
           AND t.priority = floor_priority
           AND (t.execute_at, t.id) <= (floor_execute_at, floor_id)
           AND (t.execute_at, t.id) >= (coalesce(front_execute_at, '-infinity'),
                                        coalesce(front_id, 0))
         ORDER BY t.priority, t.execute_at, t.id
         LIMIT n
         FOR UPDATE SKIP LOCKED) AS r)
        LIMIT n
    )
    SELECT coalesce(array_agg(next.id), '{}'),
           coalesce(array_agg(next.id) FILTER (WHERE next.ordering_key IS NOT NULL), '{}'),
           coalesce(array_agg(next.ordering_key) FILTER (WHERE next.ordering_key IS NOT NULL), '{}'),
           coalesce(array_agg(next.key_seq) FILTER (WHERE next.ordering_key IS NOT NULL), '{}')
    INTO head_ids, keyed_ids, keyed_keys, keyed_seqs
    FROM next;
    -- A run: the tasks waiting in each keyed head's line, up to run_length
    -- in all, claimed with it in key order (only where a key runs one
    -- task at a time). They stay blocked, so no claim can take them, and
    -- hold the key as PROCESSING tasks; the worker starts each once the
    -- one before it has completed (worker/runs.rs). A run stops at the
    -- first task in line that could not be claimed now on its own (not
    -- due, failed before, dead, or locked by another transaction), so it
    -- never steps over one. The line is every task waiting for the key,
    -- one an operator retried back into it ahead of the head included.
    IF run_length > 1 AND cardinality(keyed_ids) > 0
       AND coalesce((SELECT s.per_key_concurrency FROM outbox_queues AS s WHERE s.name = q), 1) = 1 THEN
        WITH heads AS (
            SELECT h.id, h.ordering_key, h.key_seq
            FROM unnest(keyed_ids, keyed_keys, keyed_seqs) AS h(id, ordering_key, key_seq)
        ),
        line AS MATERIALIZED (
            SELECT heads.id AS head, w.id, w.key_seq, w.ok
            FROM heads CROSS JOIN LATERAL (
                SELECT t.id, t.key_seq,
                       t.state = 'pending' AND t.dead_at IS NULL AND t.claimed_by IS NULL
                           AND t.execute_at <= coalesce(clock, now()) AS ok
                FROM outbox_tasks AS t
                WHERE t.queue = q AND t.ordering_key = heads.ordering_key AND t.blocked
                  AND t.state <> 'completed' AND (t.dead_at IS NULL OR NOT t.skip_dead)
                  AND t.id <> heads.id
                ORDER BY t.key_seq
                LIMIT run_length - 1) AS w
        ),
        -- Locked without waiting: a task another transaction is changing
        -- (an operator's cancel, say) ends the run before it. The line was
        -- read first, unlocked, so that such a task leaves no unseen gap.
        locked AS MATERIALIZED (
            SELECT t.id
            FROM outbox_tasks AS t
            WHERE t.id = ANY (ARRAY(SELECT line.id FROM line WHERE line.ok))
              AND t.blocked AND t.state = 'pending' AND t.dead_at IS NULL AND t.claimed_by IS NULL
            FOR UPDATE SKIP LOCKED
        ),
        run AS (
            SELECT line.id,
                   bool_and(line.ok AND locked.id IS NOT NULL)
                       OVER (PARTITION BY line.head ORDER BY line.key_seq) AS taken
            FROM line LEFT JOIN locked ON locked.id = line.id
        )
        SELECT coalesce(array_agg(run.id) FILTER (WHERE run.taken), '{}') INTO follower_ids FROM run;
    END IF;
    -- The worker puts the rows in claim order (found by id, they come back
    -- in id order). One clock for the whole claim, read once the rows are
    -- locked: the moment each was claimed, whatever order they are written.
    RETURN QUERY
    UPDATE outbox_tasks AS t
    SET state = 'processing',
        claims = t.claims + 1,
        claimed_by = token,
        heartbeat_at = coalesce(clock, now()),
        -- A task of a run is attempted when it starts, not now: its outcome
        -- writes the moment (below, and outbox_finish_tasks).
        attempted_at = CASE WHEN t.blocked THEN t.attempted_at
                            ELSE coalesce(clock, (SELECT clock_timestamp())) END,
        updated_at = coalesce(clock, now())
    WHERE t.id = ANY (head_ids || follower_ids)
    RETURNING t.id, t.task_type, t.queue, t.payload::text, t.retry_count, t.max_attempts,
              t.claims, t.ordering_key IS NOT NULL, t.key_seq, t.created_at, t.trace_context,
              t.priority, t.execute_at, t.workflow_id, t.blocked, t.ordering_key, moved_to;
    -- Nothing claimed, something moved: one row with a null id says how
    -- far.
    IF NOT FOUND AND moved_to IS NOT NULL THEN
        RETURN QUERY
        SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer,
               NULL::integer, NULL::boolean, NULL::bigint, NULL::timestamptz, NULL::text,
               NULL::smallint, NULL::timestamptz, NULL::bigint, NULL::boolean, NULL::text,
               moved_to;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION outbox_claim_limited(claim_queue text, wanted bigint, claim_token text,
                                     at timestamptz, intake_above bigint)
RETURNS TABLE (id bigint, task_type text, queue text, payload text, retry_count integer,
               max_attempts integer, claims integer, ordered boolean, key_seq bigint,
               created_at timestamptz, trace_context text, workflow_id bigint,
               allowed bigint, intake_to bigint)
LANGUAGE plpgsql
-- No JIT: a plan that has to use a node the settings below disable
-- costs 10^10, above jit_above_cost, and is compiled on every call (a
-- claim that sorted its rows took 0.6 s).
SET jit = off
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
    moved_to bigint;
BEGIN
    -- First the intake (migration 31): up to 1,000 committed tasks above
    -- intake_above, whatever their queue, so that this claim sees them.
    IF intake_above IS NOT NULL THEN
        moved_to := outbox_take_intake(1000, intake_above, claim_queue);
    END IF;
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
            -- One clock for the claim, read once its rows are locked.
            attempted_at = coalesce(at, (SELECT clock_timestamp())),
            updated_at = coalesce(at, now())
        FROM async_commit
        WHERE t.id = ANY (ARRAY(SELECT next.id FROM next))
        RETURNING t.id, t.task_type, t.queue, t.payload::text AS payload,
                  t.retry_count, t.max_attempts, t.claims,
                  t.ordering_key IS NOT NULL AS ordered, t.key_seq, t.created_at, t.trace_context,
                  t.workflow_id, t.priority, t.execute_at
    ),
    spent AS (
        UPDATE outbox_queues
        SET rate_tokens = (SELECT tokens FROM q) - (SELECT count(*) FROM claimed),
            rate_filled_at = (SELECT filled_at FROM q)
        WHERE name = claim_queue AND (SELECT tokens FROM q) IS NOT NULL
    )
    -- In claim order (found by id, the rows come back in id order).
    SELECT c.id, c.task_type, c.queue, c.payload, c.retry_count, c.max_attempts, c.claims,
           c.ordered, c.key_seq, c.created_at, c.trace_context, c.workflow_id, a.n AS allowed,
           moved_to
    FROM allowed AS a
    LEFT JOIN claimed AS c ON true
    ORDER BY c.priority, c.execute_at, c.id;
    -- Paused (no row at all), something moved: one row with a null id and
    -- nothing allowed says how far.
    IF NOT FOUND AND moved_to IS NOT NULL THEN
        RETURN QUERY
        SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer,
               NULL::integer, NULL::boolean, NULL::bigint, NULL::timestamptz, NULL::text,
               NULL::bigint, 0::bigint, moved_to;
    END IF;
END
$$;
