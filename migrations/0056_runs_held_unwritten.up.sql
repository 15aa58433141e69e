-- A run's middle tasks held in place without a write (issue 23, item 5).
--
-- A claim that takes a run of a key's tasks (migration 28) wrote its head
-- and its last task PROCESSING, and each task between them under the
-- claim (claimed_by and claims, migration 43), after locking it. Those
-- writes were most of what a keyed claim costs more than an unkeyed one:
-- the lock and the new version of each task, half of them not HOT (a page
-- holds about 45 tasks of as many keys, all held at about the same time),
-- 14.4 µs a task against 9.6 (PERFORMANCE.md, "Outcomes of runs joined
-- by id, and where the ordered drain's time goes").
--
-- Now only the head and the last task are written. The tasks between
-- stay as they are (PENDING, blocked, unclaimed): the run's last task,
-- PROCESSING, blocked, under the claim, holds their key, so no claim or
-- hand-over takes them, and it says which claim holds them. A task is
-- held in place when it is blocked and PENDING with no claim of its own
-- and a blocked PROCESSING task of its key (only a run's last task is
-- both) comes after it in key order, its run starting at or before it
-- (the last task's run_from). So:
--
-- * an outcome accepts an attempt of such a task (claims one more than
--   the row's) when its run's last task carries the attempt's claim, and
--   records the claim it counted (both outcome functions);
-- * whether a run goes on needs no probe of its next task: an attempt
--   written is of a run still whole (recovery and releases take a run
--   back only whole, recovery counting the run's claim on the tasks it
--   held, so that a late attempt of the run's worker is refused), and an
--   operator's cancel that judged a task held asks it to cancel rather
--   than make it dead;
-- * a hand-over never gives a key to such a task (outbox_keys_let_go);
-- * the heartbeat confirms them by their run's last task; an operator's
--   cancel marks them as running tasks (heartbeat.sql, cancel_tasks.sql);
-- * views and counts show them running under their run's claim, as
--   before;
-- * a claim locks each head's key (without waiting) before it
--   reads the head's line, so that an operator's cancel of a task in the
--   line (which locks the key first) and the claim are ordered, and takes
--   no run beside another run of the key; recovery locks a run's held
--   tasks without waiting and passes over a run with one locked elsewhere
--   (its outcome in flight); a release locks them before it judges their
--   cancels.
--
-- Tasks held under migration 43 (claimed_by set) are still understood
-- everywhere: a worker that claimed them before this migration completes
-- them, and recovery, releases and orphan holds take them back as before.
-- Builds before this migration call the claim's previous signatures
-- (outbox_claim_tasks without runs_unwritten, outbox_hold_runs likewise),
-- which hold runs that way still: their heartbeat knows no other kind.

-- Where a run starts in its key's line, on the run's last task (blocked
-- and PROCESSING): the tasks of the key from there to it are the run's,
-- held in place without a write.
ALTER TABLE outbox_tasks ADD COLUMN run_from bigint;

-- The claim of the run that holds the task at `seq` in key k's line of
-- queue q without a write, or null: the run's last task comes after it,
-- blocked and PROCESSING under the claim, and the run starts at or before
-- it. The caller checks the task itself (blocked, PENDING, unclaimed).
-- The key holders' index finds the last task (a key's head and last):
-- its predicate is stated, and the run's state test is written `IS TRUE`
-- so that the index of every running task is not read instead. The
-- outcome functions test the same inline (a call per attempt costs more
-- than the test).
CREATE FUNCTION outbox_run_claim(q text, k text, seq bigint) RETURNS text
LANGUAGE sql STABLE
AS $fn$
    SELECT p.claimed_by FROM outbox_tasks AS p
    WHERE p.queue = q AND p.ordering_key = k
      AND (p.blocked AND p.state = 'processing') IS TRUE
      AND p.key_seq > seq AND p.run_from <= seq
      AND (NOT p.blocked OR p.state = 'processing') AND p.state <> 'completed'
      AND (p.dead_at IS NULL OR NOT p.skip_dead)
    LIMIT 1
$fn$;

-- The claim, for a build that holds a run's middle tasks without a write
-- (runs_unwritten true) or as migration 43 did (false: what the previous
-- signature, below, does for builds before this migration).
CREATE FUNCTION outbox_claim_tasks(q text, n bigint, token text, clock timestamptz,
                                   floor_priority smallint, floor_execute_at timestamptz,
                                   floor_id bigint, front_execute_at timestamptz,
                                   front_id bigint, run_length integer, intake_above bigint,
                                   runs_unwritten boolean)
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
    -- The last task of each run: claimed PROCESSING, so that it holds the
    -- key until the run ends; the tasks between it and the head are held
    -- in place, unwritten (migration 56).
    last_ids bigint[] := '{}';
    -- Where each of those runs starts in its key's line (its head's
    -- key_seq), written on its last task (migration 56).
    last_froms bigint[] := '{}';
    -- The heads' keys locked for their runs (migration 56).
    run_keys text[] := '{}';
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
        -- The heads' keys, locked without waiting before their lines are
        -- read (migration 56), so that two claims never read one line
        -- (a key with two heads: places handed out while an operator
        -- raised its concurrency), and an operator's cancel of a task
        -- waiting in a line locks its key first (cancel_lock.sql). So the
        -- lines, read after, see every cancel committed before; a cancel
        -- that comes after waits, then finds the run's last task
        -- PROCESSING and marks the task as a running one. A key locked
        -- elsewhere (a cancel, an open submit) gets no run this time. (A
        -- run written as migration 43 wrote it locks its tasks instead.)
        SELECT coalesce(array_agg(o.ordering_key), '{}') INTO run_keys
        FROM (SELECT o.ordering_key FROM outbox_keys AS o
              WHERE runs_unwritten AND o.queue = q AND o.ordering_key = ANY (keyed_keys)
              FOR NO KEY UPDATE SKIP LOCKED) AS o;
        WITH heads AS (
            SELECT h.id, h.ordering_key, h.key_seq
            FROM unnest(keyed_ids, keyed_keys, keyed_seqs) AS h(id, ordering_key, key_seq)
            WHERE (NOT runs_unwritten OR h.ordering_key = ANY (run_keys))
              -- No run while another run holds the key (its last task,
              -- blocked and PROCESSING): the tasks it holds without a write
              -- are in this head's line (a place handed out while an
              -- operator raised the key's concurrency, say).
              AND NOT EXISTS (
                  SELECT 1 FROM outbox_tasks AS p
                  WHERE p.queue = q AND p.ordering_key = h.ordering_key
                    AND (p.blocked AND p.state = 'processing') IS TRUE
                    AND (NOT p.blocked OR p.state = 'processing') AND p.state <> 'completed'
                    AND (p.dead_at IS NULL OR NOT p.skip_dead))
        ),
        line AS MATERIALIZED (
            SELECT heads.id AS head, heads.key_seq AS head_seq, w.id, w.key_seq, w.ok
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
        -- Locked without waiting when the run's tasks are written (as
        -- migration 43 held them): a task another transaction is changing
        -- (an operator's cancel, say) ends the run before it. Held without
        -- a write (migration 56), they are neither locked nor written but
        -- the last: the key is this claim's from its head on, so no claim
        -- or hand-over takes them, their outcomes are checked against the
        -- run's last task, and a cancel is ordered with this claim by the
        -- key's lock (above).
        locked AS MATERIALIZED (
            SELECT t.id
            FROM outbox_tasks AS t
            WHERE NOT runs_unwritten
              AND t.id = ANY (ARRAY(SELECT line.id FROM line WHERE line.ok))
              AND t.blocked IS TRUE AND t.state = 'pending' AND t.dead_at IS NULL
              AND t.claimed_by IS NULL
            FOR UPDATE SKIP LOCKED
        ),
        run AS (
            SELECT line.id, line.head, line.head_seq, line.key_seq,
                   bool_and(line.ok AND (runs_unwritten OR locked.id IS NOT NULL))
                       OVER (PARTITION BY line.head ORDER BY line.key_seq) AS taken
            FROM line LEFT JOIN locked ON locked.id = line.id
        ),
        taken AS MATERIALIZED (
            SELECT run.id,
                   least(run.head_seq, min(run.key_seq) OVER (PARTITION BY run.head)) AS head_seq,
                   run.key_seq = max(run.key_seq) OVER (PARTITION BY run.head) AS last
            FROM run WHERE run.taken
        )
        SELECT coalesce(array_agg(taken.id), '{}'),
               coalesce(array_agg(taken.id) FILTER (WHERE taken.last), '{}'),
               coalesce(array_agg(taken.head_seq) FILTER (WHERE taken.last), '{}')
        INTO follower_ids, last_ids, last_froms FROM taken;
    END IF;
    -- The worker puts the rows in claim order (found by id, they come back
    -- in id order). One clock for the whole claim, read once the rows are
    -- locked: the moment each was claimed, whatever order they are written.
    --
    -- A run's tasks between its head and its last are held in place. With
    -- runs_unwritten, without a write (migration 56): their key is held by
    -- the run's last task, written PROCESSING under this claim, and they
    -- are returned as they are, with the claim count their attempt will
    -- carry. Otherwise as migration 43 held them: only claimed_by, claims
    -- and updated_at change, no indexed column (a HOT update where the
    -- page has room).
    RETURN QUERY
    UPDATE outbox_tasks AS t
    SET state = CASE WHEN t.blocked AND t.id NOT IN (SELECT unnest(last_ids)) THEN t.state
                     ELSE 'processing' END,
        claims = t.claims + 1,
        claimed_by = token,
        heartbeat_at = CASE WHEN t.blocked AND t.id NOT IN (SELECT unnest(last_ids))
                            THEN t.heartbeat_at ELSE coalesce(clock, now()) END,
        -- A task of a run is attempted when it starts, not now: its outcome
        -- writes the moment (below, and outbox_finish_tasks).
        attempted_at = CASE WHEN t.blocked THEN t.attempted_at
                            ELSE coalesce(clock, (SELECT clock_timestamp())) END,
        updated_at = coalesce(clock, now()),
        -- Where the run starts, on its last task (null when its tasks are
        -- written: they carry the claim themselves).
        run_from = CASE WHEN t.id = ANY (last_ids)
                        THEN CASE WHEN runs_unwritten
                                  THEN last_froms[array_position(last_ids, t.id)] END
                        ELSE t.run_from END
    WHERE t.id = ANY (head_ids || CASE WHEN runs_unwritten THEN last_ids ELSE follower_ids END)
    RETURNING t.id, t.task_type, t.queue, t.payload::text, t.retry_count, t.max_attempts,
              t.claims, t.ordering_key IS NOT NULL, t.key_seq, t.created_at, t.trace_context,
              t.priority, t.execute_at, t.workflow_id, t.blocked, t.ordering_key, moved_to;
    RETURN QUERY
    SELECT t.id, t.task_type, t.queue, t.payload::text, t.retry_count, t.max_attempts,
           t.claims + 1, true, t.key_seq, t.created_at, t.trace_context, t.priority,
           t.execute_at, t.workflow_id, true, t.ordering_key, moved_to
    FROM outbox_tasks AS t
    WHERE runs_unwritten AND t.id = ANY (follower_ids) AND t.id <> ALL (last_ids);
    -- Nothing claimed, something moved: one row with a null id says how
    -- far.
    IF cardinality(head_ids) = 0 AND moved_to IS NOT NULL THEN
        RETURN QUERY
        SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer,
               NULL::integer, NULL::boolean, NULL::bigint, NULL::timestamptz, NULL::text,
               NULL::smallint, NULL::timestamptz, NULL::bigint, NULL::boolean, NULL::text,
               moved_to;
    END IF;
END
$$;

-- The claim as builds before migration 56 call it: their heartbeat
-- confirms a run's held tasks by the claim on them, so their runs are
-- held as migration 43 held them.
CREATE OR REPLACE FUNCTION outbox_claim_tasks(q text, n bigint, token text, clock timestamptz,
                                   floor_priority smallint, floor_execute_at timestamptz,
                                   floor_id bigint, front_execute_at timestamptz,
                                   front_id bigint, run_length integer, intake_above bigint)
RETURNS TABLE (id bigint, task_type text, queue text, payload text, retry_count integer,
               max_attempts integer, claims integer, ordered boolean, key_seq bigint,
               created_at timestamptz, trace_context text, priority smallint,
               execute_at timestamptz, workflow_id bigint, follows boolean,
               ordering_key text, intake_to bigint)
LANGUAGE sql
-- As the function it calls, whose statements these are.
SET plan_cache_mode = force_generic_plan
AS $$
    SELECT * FROM outbox_claim_tasks(q, n, token, clock, floor_priority, floor_execute_at,
                                     floor_id, front_execute_at, front_id, run_length,
                                     intake_above, false)
$$;

-- Runs handed on, held as outbox_claim_tasks holds them (runs_unwritten:
-- without a write, migration 56; or as migration 43 did).
CREATE FUNCTION outbox_hold_runs(heads bigint[], token text, run_length integer,
                                 clock timestamptz, runs_unwritten boolean)
RETURNS TABLE (run_of bigint, id bigint, task_type text, queue text, payload text,
               retry_count integer, max_attempts integer, claims integer, key_seq bigint,
               created_at timestamptz, trace_context text, workflow_id bigint)
LANGUAGE plpgsql
-- As outbox_claim_tasks (migration 43), whose runs these are.
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    follower_ids bigint[];
    follower_heads bigint[];
    -- The last task of each run: claimed PROCESSING (see above).
    last_ids bigint[];
    -- Where each run starts in its key's line (migration 56).
    last_froms bigint[];
BEGIN
    IF run_length IS NULL OR run_length < 2 OR cardinality(heads) = 0 THEN
        RETURN;
    END IF;
    WITH head AS (
        -- Each head's row by its primary key (OFFSET 0: the conditions stay
        -- out of the lookup, as in outbox_complete_tasks).
        SELECT h.id, h.queue, h.ordering_key, h.key_seq
        FROM unnest(heads) AS x(id)
        CROSS JOIN LATERAL (SELECT t.id, t.queue, t.ordering_key, t.key_seq, t.claimed_by
                            FROM outbox_tasks AS t WHERE t.id = x.id OFFSET 0) AS h
        WHERE h.claimed_by = token AND h.ordering_key IS NOT NULL
          AND coalesce((SELECT s.per_key_concurrency FROM outbox_queues AS s
                        WHERE s.name = h.queue), 1) = 1
    ),
    line AS MATERIALIZED (
        SELECT head.id AS head, head.key_seq AS head_seq, w.id, w.key_seq, w.ok
        FROM head CROSS JOIN LATERAL (
            SELECT t.id, t.key_seq,
                   t.state = 'pending' AND t.dead_at IS NULL AND t.claimed_by IS NULL
                       AND t.execute_at <= coalesce(clock, now()) AS ok
            FROM outbox_tasks AS t
            WHERE t.queue = head.queue AND t.ordering_key = head.ordering_key AND t.blocked
              AND t.state <> 'completed' AND (t.dead_at IS NULL OR NOT t.skip_dead)
              AND t.id <> head.id
            ORDER BY t.key_seq
            LIMIT run_length - 1) AS w
    ),
    -- Locked without waiting when the run's tasks are written (as
    -- migration 43 held them): a task another transaction is changing (an
    -- operator's cancel, say) ends the run before it. The line was read
    -- first, unlocked, so that such a task leaves no unseen gap. Held
    -- without a write (migration 56), neither locked nor written but the
    -- last (as in outbox_claim_tasks).
    locked AS MATERIALIZED (
        SELECT t.id
        FROM outbox_tasks AS t
        WHERE NOT runs_unwritten
          AND t.id = ANY (ARRAY(SELECT line.id FROM line WHERE line.ok))
          AND t.blocked IS TRUE AND t.state = 'pending' AND t.dead_at IS NULL
          AND t.claimed_by IS NULL
        FOR UPDATE SKIP LOCKED
    ),
    run AS (
        SELECT line.id, line.head, line.head_seq, line.key_seq,
               bool_and(line.ok AND (runs_unwritten OR locked.id IS NOT NULL))
                   OVER (PARTITION BY line.head ORDER BY line.key_seq) AS taken
        FROM line LEFT JOIN locked ON locked.id = line.id
    ),
    taken AS MATERIALIZED (
        SELECT run.id, run.head, run.head_seq,
               run.key_seq = max(run.key_seq) OVER (PARTITION BY run.head) AS last
        FROM run WHERE run.taken
    )
    SELECT coalesce(array_agg(taken.id), '{}'), coalesce(array_agg(taken.head), '{}'),
           coalesce(array_agg(taken.id) FILTER (WHERE taken.last), '{}'),
           coalesce(array_agg(taken.head_seq) FILTER (WHERE taken.last), '{}')
    INTO follower_ids, follower_heads, last_ids, last_froms
    FROM taken;
    IF cardinality(follower_ids) = 0 THEN
        RETURN;
    END IF;
    -- Written found by `id = ANY`, never by a join (migration 27). A task
    -- of a run is attempted when it starts: its outcome writes the moment.
    -- Each row's head is joined by id once (migration 55).
    RETURN QUERY
    WITH written AS (
        UPDATE outbox_tasks AS t
        SET state = CASE WHEN t.id = ANY (last_ids) THEN 'processing' ELSE t.state END,
            claims = t.claims + 1,
            claimed_by = token,
            heartbeat_at = CASE WHEN t.id = ANY (last_ids) THEN coalesce(clock, now())
                                ELSE t.heartbeat_at END,
            updated_at = coalesce(clock, now()),
            run_from = CASE WHEN runs_unwritten
                            THEN last_froms[array_position(last_ids, t.id)] END
        WHERE t.id = ANY (CASE WHEN runs_unwritten THEN last_ids ELSE follower_ids END)
        RETURNING t.id, t.task_type, t.queue, t.payload::text AS payload, t.retry_count,
                  t.max_attempts, t.claims, t.key_seq, t.created_at, t.trace_context,
                  t.workflow_id
    ),
    held AS (
        SELECT * FROM written
        UNION ALL
        -- The tasks between, held in place without a write (migration 56).
        SELECT t.id, t.task_type, t.queue, t.payload::text, t.retry_count, t.max_attempts,
               t.claims + 1, t.key_seq, t.created_at, t.trace_context, t.workflow_id
        FROM outbox_tasks AS t
        WHERE runs_unwritten AND t.id = ANY (follower_ids) AND t.id <> ALL (last_ids)
    )
    SELECT f.head, held.id, held.task_type, held.queue, held.payload, held.retry_count,
           held.max_attempts, held.claims, held.key_seq, held.created_at, held.trace_context,
           held.workflow_id
    FROM held JOIN unnest(follower_ids, follower_heads) AS f(id, head) ON f.id = held.id;
END
$$;

-- As builds before migration 56 call it (see outbox_claim_tasks).
CREATE OR REPLACE FUNCTION outbox_hold_runs(heads bigint[], token text, run_length integer,
                                 clock timestamptz)
RETURNS TABLE (run_of bigint, id bigint, task_type text, queue text, payload text,
               retry_count integer, max_attempts integer, claims integer, key_seq bigint,
               created_at timestamptz, trace_context text, workflow_id bigint)
LANGUAGE sql
-- As the function it calls, whose statements these are.
SET plan_cache_mode = force_generic_plan
AS $$
    SELECT * FROM outbox_hold_runs(heads, token, run_length, clock, false)
$$;

CREATE OR REPLACE FUNCTION outbox_complete_tasks(attempt_ids bigint[], attempt_claims integer[],
                                      attempt_tokens text[], clock timestamptz,
                                      hand_queues text[], hand_places integer[],
                                      hand_token text, delete_all boolean,
                                      continuing bigint[], attempt_started timestamptz[],
                                      run_next bigint[])
RETURNS TABLE (id bigint, handed boolean, claimed boolean, queue text, task_type text,
               payload text, retry_count integer, max_attempts integer, claims integer,
               key_seq bigint, created_at timestamptz, trace_context text, ordered boolean,
               workflow_id bigint, deferred_key text, run_halted boolean, cancelled boolean)
LANGUAGE plpgsql
-- No JIT: a plan that has to use a node the settings below disable
-- costs 10^10, above jit_above_cost, and is compiled on every call (a
-- claim that sorted its rows took 0.6 s).
SET jit = off
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    -- Whether any attempt is a task of a run, which started after its
    -- claim (the worker sends no array when none is).
    runs_started boolean := attempt_started IS NOT NULL;
    halted text[] := '{}';
    -- Whether any attempt's run would go on, and those that do: every
    -- attempt of a run that is written (below). Its next task is still
    -- held: recovery and releases take a run back only whole (its head and
    -- its last task, PROCESSING under its claim; the tasks between held in
    -- place without a write, migration 56), and recovery counts the run's
    -- claim on those, so a late attempt is refused; an operator's cancel
    -- that judged a task held asks it to cancel rather than make it dead
    -- (cancel_lock.sql, cancel_tasks.sql). Claim tokens are never reused.
    any_runs boolean := cardinality(continuing) > 0;
    running_on bigint[] := '{}';
    -- The plain path's arrays: the attempts found held, whether any needs
    -- more than a delete (a cancel asked for, a unique key covering
    -- COMPLETED), and what the delete took.
    plain_ids bigint[];
    -- When each of them started, if it is a run's (parallel to plain_ids).
    plain_started timestamptz[];
    any_special boolean;
    gone_ids bigint[];
    gone_queues text[];
    gone_keys text[];
    released_queues text[];
    released_keys text[];
BEGIN
    IF any_runs THEN
        running_on := continuing;
        -- A run goes on only in a queue that may start tasks now: in one
        -- paused or given limits since the claim, the run ends here (its
        -- key is let go of, and the worker gives the rest back).
        SELECT coalesce(array_agg(s.name), '{}') INTO halted
        FROM outbox_queues AS s
        WHERE s.paused_at IS NOT NULL OR s.global_concurrency IS NOT NULL
           OR s.rate_per_second IS NOT NULL;
    END IF;
    -- Each attempt's row by its primary key, locked in id order (as in the
    -- statements below, which find them locked by this transaction then).
    SELECT coalesce(array_agg(t.id), '{}'), coalesce(bool_or(t.special), false),
           array_agg(o.started)
    INTO plain_ids, any_special, plain_started
    FROM (SELECT * FROM unnest(attempt_ids, attempt_claims, attempt_tokens, attempt_started)
                        AS a(id, claims, token, started)
          ORDER BY a.id OFFSET 0) AS o
    CROSS JOIN LATERAL (
        SELECT t.id,
               (t.cancel_requested_at IS NOT NULL AND t.workflow_id IS NULL)
                   OR (NOT delete_all AND coalesce(t.unique_states & 8, 0) <> 0) AS special
        FROM outbox_tasks AS t
        WHERE t.id = o.id AND (t.claims = o.claims AND t.claimed_by = o.token
                   OR t.claims = o.claims - 1
                   AND t.claimed_by IS NULL AND t.blocked AND t.state = 'pending'
                   AND EXISTS (
                       SELECT 1 FROM outbox_tasks AS p
                       WHERE p.queue = t.queue AND p.ordering_key = t.ordering_key
                         AND (p.blocked AND p.state = 'processing') IS TRUE AND p.key_seq > t.key_seq
                         AND p.run_from <= t.key_seq
                         AND p.claimed_by = o.token
                         AND (NOT p.blocked OR p.state = 'processing') AND p.state <> 'completed'
                         AND (p.dead_at IS NULL OR NOT p.skip_dead)))
        OFFSET 0
        FOR UPDATE OF t) AS t;
    IF NOT any_special THEN
        -- Every attempt stale: nothing to write.
        IF cardinality(plain_ids) = 0 THEN
            RETURN;
        END IF;
        -- The usual batch: every attempt found leaves the table. Statements
        -- as small as that needs (migration 41 says why).
        IF delete_all THEN
            WITH gone AS (
                DELETE FROM outbox_tasks AS t
                WHERE t.id = ANY (plain_ids)
                RETURNING t.id, t.queue, t.ordering_key
            )
            SELECT array_agg(g.id), array_agg(g.queue), array_agg(g.ordering_key)
            INTO gone_ids, gone_queues, gone_keys
            FROM gone AS g;
        ELSIF runs_started AND cardinality(attempt_ids) > 16 THEN
            -- The batch carries tasks of runs, each with when it started
            -- (attempt_started, parallel to attempt_ids): joined to the
            -- rows once, by attempt (id, claims and claim token: the
            -- attempt that was written, not another of the same task in
            -- the batch; grouped, so that an attempt sent twice still
            -- writes one row). Looked up per row with array_position, as
            -- below, the start read the whole batch for every row, a cost
            -- that grew with the square of the batch (migration 55); the
            -- join costs a few microseconds to set up, which a batch of a
            -- few does not repay.
            WITH gone AS (
                DELETE FROM outbox_tasks AS t
                WHERE t.id = ANY (plain_ids)
                RETURNING t.*
            ),
            archived AS (
                INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                                 max_attempts, claims, execute_at, created_at,
                                                 attempted_at, finished_at, last_error, result,
                                                 unique_key, ordering_key, key_seq)
                SELECT gone.id, task_type, queue, payload, priority, retry_count, max_attempts,
                       gone.claims + CASE WHEN gone.claimed_by IS NULL THEN 1 ELSE 0 END,
                       execute_at, created_at, coalesce(a.started, attempted_at),
                       coalesce(clock, clock_timestamp()), last_error,
                       NULL, unique_key, ordering_key, key_seq
                FROM gone
                LEFT JOIN (SELECT a.id, min(a.started) AS started
                           FROM unnest(plain_ids, plain_started) AS a(id, started)
                           GROUP BY a.id) AS a
                       ON a.id = gone.id
            )
            SELECT array_agg(g.id), array_agg(g.queue), array_agg(g.ordering_key)
            INTO gone_ids, gone_queues, gone_keys
            FROM gone AS g;
        ELSE
            WITH gone AS (
                DELETE FROM outbox_tasks AS t
                WHERE t.id = ANY (plain_ids)
                RETURNING t.*
            ),
            archived AS (
                INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                                 max_attempts, claims, execute_at, created_at,
                                                 attempted_at, finished_at, last_error, result,
                                                 unique_key, ordering_key, key_seq)
                SELECT id, task_type, queue, payload, priority, retry_count, max_attempts,
                       claims + CASE WHEN claimed_by IS NULL THEN 1 ELSE 0 END,
                       execute_at, created_at,
                       CASE WHEN runs_started
                            THEN coalesce(plain_started[array_position(plain_ids, gone.id)],
                                          attempted_at)
                            ELSE attempted_at END,
                       coalesce(clock, clock_timestamp()), last_error,
                       NULL, unique_key, ordering_key, key_seq
                FROM gone
            )
            SELECT array_agg(g.id), array_agg(g.queue), array_agg(g.ordering_key)
            INTO gone_ids, gone_queues, gone_keys
            FROM gone AS g;
        END IF;
        RETURN QUERY
        SELECT g.id, false, NULL::bool, NULL::text, NULL::text, NULL::text, NULL::int, NULL::int,
               NULL::int, NULL::bigint, NULL::timestamptz, NULL::text, NULL::bool, NULL::bigint,
               NULL::text,
               any_runs AND g.id IN (SELECT unnest(continuing))
                   AND (g.queue = ANY (halted) OR g.id NOT IN (SELECT unnest(running_on))),
               false
        FROM unnest(gone_ids, gone_queues) AS g(id, queue);
        -- Keys let go of (a task of a run that goes on keeps its key), handed
        -- on after every row above is written, as below.
        -- (Most often every keyed task's run goes on: nothing to look at.)
        IF cardinality(array_remove(gone_keys, NULL)) > 0
           AND (gone_queues && halted OR NOT gone_ids <@ running_on) THEN
            SELECT array_agg(g.queue), array_agg(g.k)
            INTO released_queues, released_keys
            FROM unnest(gone_ids, gone_queues, gone_keys) AS g(id, queue, k)
            WHERE g.k IS NOT NULL
              AND (g.id NOT IN (SELECT unnest(running_on)) OR g.queue = ANY (halted));
            IF released_queues IS NOT NULL THEN
                RETURN QUERY
                WITH handed AS (
                    SELECT l.*
                    FROM outbox_keys_let_go(released_queues, released_keys,
                                            interval '50 milliseconds', hand_queues, hand_places,
                                            hand_token, clock) AS l
                )
                SELECT id, true, claimed, queue, task_type, payload, retry_count, max_attempts,
                       claims, key_seq, created_at, trace_context, true, NULL::bigint, NULL::text,
                       NULL::bool, NULL::bool
                FROM handed WHERE deferred_key IS NULL
                UNION ALL
                SELECT NULL, true, false, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                       NULL, NULL, deferred_key, NULL, NULL
                FROM handed WHERE deferred_key IS NOT NULL;
            END IF;
        END IF;
        RETURN;
    END IF;
    -- A cancel asked for, or a unique key covering COMPLETED: the whole
    -- statement, which splits the batch between the delete and the update.
    IF delete_all THEN
        RETURN QUERY
        WITH batch AS (
            -- Each attempt's row by its primary key, locked in id order (see
            -- the other branch).
            SELECT t.id, t.cancelled
            FROM (SELECT * FROM unnest(attempt_ids, attempt_claims, attempt_tokens)
                                AS a(id, claims, token)
                  ORDER BY a.id OFFSET 0) AS o
            CROSS JOIN LATERAL (
                SELECT t.id, (t.cancel_requested_at IS NOT NULL AND t.workflow_id IS NULL) AS cancelled
                FROM outbox_tasks AS t
                WHERE t.id = o.id AND (t.claims = o.claims AND t.claimed_by = o.token
                   OR t.claims = o.claims - 1
                   AND t.claimed_by IS NULL AND t.blocked AND t.state = 'pending'
                   AND EXISTS (
                       SELECT 1 FROM outbox_tasks AS p
                       WHERE p.queue = t.queue AND p.ordering_key = t.ordering_key
                         AND (p.blocked AND p.state = 'processing') IS TRUE AND p.key_seq > t.key_seq
                         AND p.run_from <= t.key_seq
                         AND p.claimed_by = o.token
                         AND (NOT p.blocked OR p.state = 'processing') AND p.state <> 'completed'
                         AND (p.dead_at IS NULL OR NOT p.skip_dead)))
                OFFSET 0
                FOR UPDATE OF t) AS t
        ),
        gone AS (
            DELETE FROM outbox_tasks AS t
            WHERE t.id = ANY (ARRAY(SELECT b.id FROM batch AS b WHERE NOT b.cancelled))
            RETURNING t.id, t.queue, t.ordering_key
        ),
        cancelled AS (
            UPDATE outbox_tasks AS t
            SET state = 'failed',
                dead_at = now(),
                finished_at = now(),
                last_error = 'cancelled by an operator',
                -- The attempt the cancel stopped counts (migration 30).
                retry_count = t.retry_count + 1,
                -- Out of its key's line: a dead task does not wait in it.
                blocked = false,
                attempted_at = CASE WHEN runs_started
                                    THEN coalesce(plain_started[array_position(plain_ids, t.id)],
                                                  t.attempted_at)
                                    ELSE t.attempted_at END,
                claims = t.claims + CASE WHEN t.claimed_by IS NULL THEN 1 ELSE 0 END,
                claimed_by = NULL,
                heartbeat_at = NULL,
                updated_at = now()
            WHERE t.id = ANY (ARRAY(SELECT b.id FROM batch AS b WHERE b.cancelled))
            RETURNING t.id, t.queue, t.ordering_key
        ),
        handed AS (
            -- Every one of them let go of its ordering key (a cancelled task is
            -- skipped): the key goes on, after every row above is written, if its
            -- row can be taken soon enough (as in complete_tasks.sql).
            SELECT l.*
            FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k
                  FROM (SELECT id, queue, ordering_key FROM gone
                        UNION ALL
                        SELECT id, queue, ordering_key FROM cancelled) AS k
                  WHERE ordering_key IS NOT NULL AND (k.id NOT IN (SELECT unnest(running_on))
                       OR k.queue = ANY (halted))
                  HAVING count(*) > 0) AS released,
                 LATERAL outbox_keys_let_go(released.q, released.k, interval '50 milliseconds',
                                            hand_queues, hand_places, hand_token, clock) AS l
        )
        SELECT id, false AS handed, NULL::bool AS claimed, NULL::text AS queue, NULL::text AS task_type,
               NULL::text AS payload, NULL::int AS retry_count, NULL::int AS max_attempts,
               NULL::int AS claims, NULL::bigint AS key_seq, NULL::timestamptz AS created_at,
               NULL::text AS trace_context, NULL::bool AS ordered, NULL::bigint AS workflow_id,
               NULL::text AS deferred_key,
               any_runs AND id IN (SELECT unnest(continuing))
                   AND (queue = ANY (halted) OR id NOT IN (SELECT unnest(running_on))) AS run_halted,
               false AS cancelled
        FROM gone
        UNION ALL
        SELECT id, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               any_runs AND id IN (SELECT unnest(continuing))
                   AND (queue = ANY (halted) OR id NOT IN (SELECT unnest(running_on))),
               true
        FROM cancelled
        UNION ALL
        SELECT id, true, claimed, queue, task_type, payload, retry_count, max_attempts, claims, key_seq,
               created_at, trace_context, true, NULL, NULL, NULL, NULL
        FROM handed WHERE deferred_key IS NULL
        UNION ALL
        SELECT NULL, true, false, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               deferred_key, NULL, NULL
        FROM handed WHERE deferred_key IS NOT NULL;
    ELSE
        RETURN QUERY
        WITH batch AS (
            -- Locked first, so that what decides a row's fate is its latest version
            -- (a cancel committed meanwhile is seen), and the DELETE and UPDATE
            -- below split the batch between them exactly. Each attempt's row is
            -- probed by its primary key (LATERAL, OFFSET 0: no join order to
            -- choose), in id order, as the heartbeat locks them: in the order of
            -- the batch, the two deadlocked (found after 1 s, the heartbeat
            -- retried late, and recovery took live tasks). The claim token is
            -- unique to the claim statement (only PROCESSING rows have one: a
            -- CHECK constraint says so).
            SELECT t.id, t.cancelled, t.covers_completed
            FROM (SELECT * FROM unnest(attempt_ids, attempt_claims, attempt_tokens)
                                AS a(id, claims, token)
                  ORDER BY a.id OFFSET 0) AS o
            CROSS JOIN LATERAL (
                SELECT t.id,
                       (t.cancel_requested_at IS NOT NULL AND t.workflow_id IS NULL) AS cancelled,
                       coalesce(t.unique_states & 8, 0) <> 0 AS covers_completed
                FROM outbox_tasks AS t
                WHERE t.id = o.id AND (t.claims = o.claims AND t.claimed_by = o.token
                   OR t.claims = o.claims - 1
                   AND t.claimed_by IS NULL AND t.blocked AND t.state = 'pending'
                   AND EXISTS (
                       SELECT 1 FROM outbox_tasks AS p
                       WHERE p.queue = t.queue AND p.ordering_key = t.ordering_key
                         AND (p.blocked AND p.state = 'processing') IS TRUE AND p.key_seq > t.key_seq
                         AND p.run_from <= t.key_seq
                         AND p.claimed_by = o.token
                         AND (NOT p.blocked OR p.state = 'processing') AND p.state <> 'completed'
                         AND (p.dead_at IS NULL OR NOT p.skip_dead)))
                OFFSET 0
                FOR UPDATE OF t) AS t
        ),
        -- The rows are written found by `id = ANY`, never by a join with
        -- the batch (see migration 27).
        gone AS (
            DELETE FROM outbox_tasks AS t
            WHERE t.id = ANY (ARRAY(SELECT b.id FROM batch AS b
                                    WHERE NOT b.cancelled AND NOT b.covers_completed))
            RETURNING t.*
        ),
        archived AS (
            INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                             max_attempts, claims, execute_at, created_at, attempted_at,
                                             finished_at, last_error, result, unique_key, ordering_key,
                                             key_seq)
            SELECT gone.id, task_type, queue, payload, priority, retry_count, max_attempts,
                   gone.claims + CASE WHEN gone.claimed_by IS NULL THEN 1 ELSE 0 END,
                   execute_at, created_at, coalesce(a.started, attempted_at),
                   coalesce(clock, clock_timestamp()), last_error,
                   NULL, unique_key, ordering_key, key_seq
            FROM gone
            -- Joined by attempt, as in the usual batch above, whatever the
            -- batch's size (attempt_started is null unless the batch carries
            -- tasks of runs, and every start is then null).
            LEFT JOIN (SELECT a.id, min(a.started) AS started
                       FROM unnest(plain_ids, plain_started) AS a(id, started)
                       GROUP BY a.id) AS a
                   ON a.id = gone.id
        ),
        kept AS (
            UPDATE outbox_tasks AS t
            SET state = CASE WHEN t.id = ANY (cancelled_ids.ids) THEN 'failed'
                             ELSE 'completed' END::outbox_task_state,
                -- An operator asked to cancel it: it ends dead, whatever it returned.
                dead_at = CASE WHEN t.id = ANY (cancelled_ids.ids)
                               THEN coalesce(clock, clock_timestamp()) END,
                last_error = CASE WHEN t.id = ANY (cancelled_ids.ids) THEN 'cancelled by an operator'
                                  ELSE t.last_error END,
                -- The attempt the cancel stopped counts, and the dead task
                -- leaves its key's line (migration 30).
                retry_count = t.retry_count + CASE WHEN t.id = ANY (cancelled_ids.ids) THEN 1
                                                   ELSE 0 END,
                blocked = t.blocked AND t.id <> ALL (cancelled_ids.ids),
                finished_at = coalesce(clock, clock_timestamp()),
                attempted_at = CASE WHEN runs_started
                                    THEN coalesce(plain_started[array_position(plain_ids, t.id)],
                                                  t.attempted_at)
                                    ELSE t.attempted_at END,
                claims = t.claims + CASE WHEN t.claimed_by IS NULL THEN 1 ELSE 0 END,
                claimed_by = NULL,
                heartbeat_at = NULL,
                updated_at = coalesce(clock, now())
            FROM (SELECT ARRAY(SELECT b.id FROM batch AS b WHERE b.cancelled) AS ids) AS cancelled_ids
            WHERE t.id = ANY (ARRAY(SELECT b.id FROM batch AS b
                                    WHERE b.cancelled OR b.covers_completed))
            RETURNING t.id, t.queue, t.ordering_key, t.state, t.dead_at, t.skip_dead,
                      t.id = ANY (cancelled_ids.ids) AS cancelled
        ),
        handed AS (
            -- Tasks that let go of their ordering key hand it on (after every row
            -- above is written: the aggregate reads them all first), if its row can
            -- be taken soon enough. A task gone to the history has let go of it.
            SELECT l.*
            FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k
                  FROM (SELECT id, queue, ordering_key FROM gone
                        UNION ALL
                        SELECT id, queue, ordering_key FROM kept
                        WHERE NOT (state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead))) AS k
                  WHERE ordering_key IS NOT NULL AND (k.id NOT IN (SELECT unnest(running_on))
                       OR k.queue = ANY (halted))
                  HAVING count(*) > 0) AS released,
                 LATERAL outbox_keys_let_go(released.q, released.k, interval '50 milliseconds',
                                            hand_queues, hand_places, hand_token, clock) AS l
        )
        SELECT id, false AS handed, NULL::bool AS claimed, NULL::text AS queue, NULL::text AS task_type,
               NULL::text AS payload, NULL::int AS retry_count, NULL::int AS max_attempts,
               NULL::int AS claims, NULL::bigint AS key_seq, NULL::timestamptz AS created_at,
               NULL::text AS trace_context, NULL::bool AS ordered, NULL::bigint AS workflow_id,
               NULL::text AS deferred_key,
               any_runs AND id IN (SELECT unnest(continuing))
                   AND (queue = ANY (halted) OR id NOT IN (SELECT unnest(running_on))) AS run_halted,
               false AS cancelled
        FROM gone
        UNION ALL
        SELECT id, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               any_runs AND id IN (SELECT unnest(continuing))
                   AND (queue = ANY (halted) OR id NOT IN (SELECT unnest(running_on))),
               cancelled
        FROM kept
        UNION ALL
        SELECT id, true, claimed, queue, task_type, payload, retry_count, max_attempts, claims, key_seq,
               created_at, trace_context, true, NULL, NULL, NULL, NULL
        FROM handed WHERE deferred_key IS NULL
        UNION ALL
        SELECT NULL, true, false, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               deferred_key, NULL, NULL
        FROM handed WHERE deferred_key IS NOT NULL;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION outbox_finish_tasks(attempt_ids bigint[], attempt_claims integer[],
                                    attempt_tokens text[], new_states text[],
                                    add_retries integer[], delays_us bigint[], deads boolean[],
                                    errors text[], clock timestamptz, results text[],
                                    attempt_started timestamptz[], continuing bigint[],
                                    run_next bigint[])
RETURNS TABLE (id bigint, queue text, deferred_key text, run_halted boolean, cancelled boolean)
LANGUAGE plpgsql
-- No JIT: a plan that has to use a node the settings below disable
-- costs 10^10, above jit_above_cost, and is compiled on every call (a
-- claim that sorted its rows took 0.6 s).
SET jit = off
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    halted text[] := '{}';
    -- Whether any attempt's run would go on, and those that do: every
    -- attempt of a run that is written (below). Its next task is still
    -- held: recovery and releases take a run back only whole (its head and
    -- its last task, PROCESSING under its claim; the tasks between held in
    -- place without a write, migration 56), and recovery counts the run's
    -- claim on those, so a late attempt is refused; an operator's cancel
    -- that judged a task held asks it to cancel rather than make it dead
    -- (cancel_lock.sql, cancel_tasks.sql). Claim tokens are never reused.
    any_runs boolean := cardinality(continuing) > 0;
    running_on bigint[] := '{}';
BEGIN
    IF any_runs THEN
        running_on := continuing;
        -- As in outbox_complete_tasks: a run ends in a queue paused or
        -- given limits since its claim.
        SELECT coalesce(array_agg(s.name), '{}') INTO halted
        FROM outbox_queues AS s
        WHERE s.paused_at IS NOT NULL OR s.global_concurrency IS NOT NULL
           OR s.rate_per_second IS NOT NULL;
    END IF;
    RETURN QUERY
    WITH batch AS (
        -- Locked first, so that what decides a row's fate is its latest version
        -- and the DELETE and UPDATE below split the batch between them exactly.
        -- Each attempt's row is probed by its primary key, in id order, as in
        -- outbox_complete_tasks.
        SELECT t.id, o.state, o.add_retry, o.delay_us, o.dead, o.error, o.result, o.started,
               t.cancelled,
               o.state = 'completed' AND NOT t.cancelled AND NOT t.covers_completed AS archive
        FROM (SELECT * FROM unnest(attempt_ids, attempt_claims, attempt_tokens, new_states,
                                   add_retries, delays_us, deads, errors, results, attempt_started)
                            AS a(id, claims, token, state, add_retry, delay_us, dead, error, result,
                                 started)
              ORDER BY a.id OFFSET 0) AS o
        CROSS JOIN LATERAL (
            SELECT t.id,
                   t.cancel_requested_at IS NOT NULL AS cancelled,
                   coalesce(t.unique_states & 8, 0) <> 0 AS covers_completed
            FROM outbox_tasks AS t
            WHERE t.id = o.id AND (t.claims = o.claims AND t.claimed_by = o.token
                   OR t.claims = o.claims - 1
                   AND t.claimed_by IS NULL AND t.blocked AND t.state = 'pending'
                   AND EXISTS (
                       SELECT 1 FROM outbox_tasks AS p
                       WHERE p.queue = t.queue AND p.ordering_key = t.ordering_key
                         AND (p.blocked AND p.state = 'processing') IS TRUE AND p.key_seq > t.key_seq
                         AND p.run_from <= t.key_seq
                         AND p.claimed_by = o.token
                         AND (NOT p.blocked OR p.state = 'processing') AND p.state <> 'completed'
                         AND (p.dead_at IS NULL OR NOT p.skip_dead)))
            OFFSET 0
            FOR UPDATE OF t) AS t
    ),
    gone AS (
        DELETE FROM outbox_tasks AS t
        USING batch
        WHERE t.id = ANY (ARRAY(SELECT b.id FROM batch AS b WHERE b.archive))
          AND t.id = batch.id AND batch.archive
        RETURNING t.*, batch.result AS new_result, batch.started AS new_started
    ),
    archived AS (
        INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                         max_attempts, claims, execute_at, created_at, attempted_at,
                                         finished_at, last_error, result, unique_key, ordering_key,
                                         key_seq)
        SELECT id, task_type, queue, payload, priority, retry_count, max_attempts,
               claims + CASE WHEN claimed_by IS NULL THEN 1 ELSE 0 END,
               execute_at, created_at, coalesce(new_started, attempted_at),
               coalesce(clock, clock_timestamp()), last_error, new_result::jsonb, unique_key, ordering_key, key_seq
        FROM gone
    ),
    kept AS (
        UPDATE outbox_tasks AS t
        SET state = CASE WHEN o.cancelled THEN 'failed' ELSE o.state::outbox_task_state END,
            -- The attempt a cancel stopped counts, whatever it returned
            -- (migration 30).
            retry_count = t.retry_count + CASE WHEN o.cancelled THEN 1 ELSE o.add_retry END,
            execute_at = CASE WHEN o.state = 'completed' OR o.cancelled THEN t.execute_at
                              ELSE coalesce(clock, now()) + o.delay_us * interval '1 microsecond' END,
            dead_at = CASE WHEN o.dead OR o.cancelled THEN coalesce(clock, clock_timestamp()) END,
            last_error = CASE WHEN o.cancelled THEN 'cancelled by an operator'
                              ELSE coalesce(o.error, t.last_error) END,
            result = CASE WHEN NOT o.cancelled THEN o.result::jsonb END,
            finished_at = CASE WHEN o.state = 'pending' AND NOT o.cancelled THEN NULL
                               ELSE coalesce(clock, clock_timestamp()) END,
            -- A task of a run started after its claim (migration 28).
            attempted_at = coalesce(o.started, t.attempted_at),
            -- A task of a run that ran and did not complete is the first in
            -- its key's line: it holds the key now (the rest of its run goes
            -- back behind it).
            blocked = t.blocked AND o.state = 'completed' AND NOT o.cancelled,
            claims = t.claims + CASE WHEN t.claimed_by IS NULL THEN 1 ELSE 0 END,
            claimed_by = NULL,
            heartbeat_at = NULL,
            updated_at = coalesce(clock, now())
        FROM batch AS o
        WHERE t.id = ANY (ARRAY(SELECT b.id FROM batch AS b WHERE NOT b.archive))
          AND t.id = o.id AND NOT o.archive
        RETURNING t.id, t.queue, t.ordering_key, t.state, t.dead_at, t.skip_dead, t.blocked,
                  o.cancelled
    ),
    handed AS (
        -- Tasks that let go of their ordering key hand it on (after every row
        -- above is written: the aggregate reads them all first), if its row can
        -- be taken soon enough. A task gone to the history has let go of it.
        -- Materialized (the function is volatile) and read whole below.
        SELECT l.queue, l.deferred_key
        FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k
              FROM (SELECT id, queue, ordering_key FROM gone
                    UNION ALL
                    SELECT id, queue, ordering_key FROM kept
                    WHERE NOT (state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead))) AS k
              WHERE ordering_key IS NOT NULL
                AND (k.id NOT IN (SELECT unnest(running_on)) OR k.queue = ANY (halted))
              HAVING count(*) > 0) AS released,
             LATERAL outbox_keys_let_go(released.q, released.k, interval '50 milliseconds',
                                        '{}'::text[], '{}'::int[], NULL::text,
                                        NULL::timestamptz) AS l
    )
    SELECT id, NULL::text AS queue, NULL::text AS deferred_key,
           any_runs AND id IN (SELECT unnest(continuing))
               AND (queue = ANY (halted) OR id NOT IN (SELECT unnest(running_on))) AS run_halted,
           false AS cancelled
    FROM gone
    UNION ALL
    SELECT id, NULL, NULL,
           any_runs AND id IN (SELECT unnest(continuing))
               AND (queue = ANY (halted) OR id NOT IN (SELECT unnest(running_on))),
           cancelled
    FROM kept
    UNION ALL
    SELECT NULL, queue, deferred_key, NULL, NULL FROM handed WHERE deferred_key IS NOT NULL;
END
$$;

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
              -- place or not (migrations 43 and 56: one held without a
              -- write lies before its run's last task).
              AND t.state <> 'processing' AND t.claimed_by IS NULL
              AND NOT (t.state = 'pending'
                       AND outbox_run_claim(t.queue, t.ordering_key, t.key_seq) IS NOT NULL)
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

CREATE OR REPLACE VIEW outbox_all_tasks AS
SELECT t.id, t.task_type, t.queue, t.payload,
       -- A task of a run held in place is claimed: it shows as running,
       -- under its run's claim if it is held without a write (migration
       -- 56), with the claim counted that its attempt carries.
       CASE WHEN t.claimed_by IS NOT NULL OR r.claimed_by IS NOT NULL
            THEN 'processing'::outbox_task_state ELSE t.state END AS state,
       t.priority, t.retry_count, t.max_attempts,
       t.claims + CASE WHEN r.claimed_by IS NOT NULL THEN 1 ELSE 0 END AS claims,
       t.execute_at, t.created_at, t.updated_at,
       coalesce(t.claimed_by, r.claimed_by) AS claimed_by, t.heartbeat_at, t.finished_at,
       t.dead_at, t.last_error, t.unique_key, t.unique_states, t.result, t.cancel_requested_at,
       t.ordering_key, t.key_seq, t.blocked, t.skip_dead, t.attempted_at
FROM outbox_tasks AS t
LEFT JOIN LATERAL (
    SELECT outbox_run_claim(t.queue, t.ordering_key, t.key_seq) AS claimed_by
    WHERE t.claimed_by IS NULL AND t.blocked AND t.state = 'pending') AS r ON true
UNION ALL
SELECT id, task_type, queue, payload, 'completed'::outbox_task_state, priority, retry_count,
       max_attempts, claims, execute_at, created_at, finished_at, NULL::text, NULL::timestamptz,
       finished_at, NULL::timestamptz, last_error, unique_key, NULL::smallint, result,
       NULL::timestamptz, ordering_key, key_seq, false, false, attempted_at
FROM outbox_task_history
UNION ALL
SELECT id, task_type, queue, payload, 'pending'::outbox_task_state, priority, 0, max_attempts,
       0, created_at, created_at, created_at, NULL::text, NULL::timestamptz, NULL::timestamptz,
       NULL::timestamptz, NULL::text, NULL::text, NULL::smallint, NULL::jsonb,
       NULL::timestamptz, NULL::text, NULL::bigint, false, false, NULL::timestamptz
FROM outbox_intake;

-- A workflow's step completed is a deleted row that was claimed, or one
-- its run held in place without a write (migration 56): blocked, PENDING
-- and alive. Only outcomes delete such rows (periodic ticks, deleted
-- unclaimed, are no workflow's steps).
CREATE OR REPLACE FUNCTION outbox_workflow_flush_completed() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    deaths text := coalesce(current_setting('outbox.workflow_notes', true), '');
    wfs bigint[];
    tasks bigint[];
    kinds text[];
    steps text[];
BEGIN
    IF deaths = '' AND NOT EXISTS (SELECT 1 FROM gone
                                   WHERE workflow_id IS NOT NULL
                                     AND (claimed_by IS NOT NULL
                                          OR state = 'pending' AND blocked AND dead_at IS NULL)) THEN
        RETURN NULL;
    END IF;
    IF deaths <> '' THEN
        PERFORM set_config('outbox.workflow_notes', '', true);
    END IF;
    WITH noted AS (
        SELECT g.workflow_id AS wf, g.id AS task, 'c' AS kind, g.workflow_step AS step
        FROM gone AS g
        WHERE g.workflow_id IS NOT NULL
          AND (g.claimed_by IS NOT NULL OR g.state = 'pending' AND g.blocked AND g.dead_at IS NULL)
        UNION ALL
        SELECT split_part(n, '/', 1)::bigint, split_part(n, '/', 2)::bigint, split_part(n, '/', 3),
               substr(n, length(split_part(n, '/', 1)) + length(split_part(n, '/', 2)) + 5)
        FROM unnest(string_to_array(rtrim(deaths, ';'), ';')) AS n
    )
    SELECT array_agg(wf), array_agg(task), array_agg(kind), array_agg(step)
    INTO wfs, tasks, kinds, steps
    FROM noted;
    IF wfs IS NOT NULL THEN
        PERFORM outbox_workflow_close(wfs, tasks, kinds, steps);
    END IF;
    RETURN NULL;
END
$$;
