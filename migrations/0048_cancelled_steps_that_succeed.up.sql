-- A workflow's step that succeeds after an operator's cancel is completed.
--
-- A cancel asked for while a task runs turned whatever its attempt
-- returned into a dead task ("cancelled by an operator"). For a step of a
-- saga that hid done work: a handler that finished its effect (a charge)
-- before it saw its cancellation token ended dead, and a step that never
-- completed is never compensated, so the charge stayed. Now a step's
-- success is recorded as a success whatever the cancel: the workflow (whose
-- waiting steps the cancel stopped) then compensates it with the steps
-- completed before it, or, a workflow without compensations, ends failed
-- with the step completed. Only the success changes: a step that fails,
-- snoozes or gives up after the cancel ends dead as before, and so does
-- any plain task (the worker's rule and complete_in_transaction.sql say
-- the same). The function is migration 43's, with that condition.
--
-- And a saga an operator cancelled is compensated even when every step it
-- still ran succeeded: a cancel that came during its last steps found
-- nothing waiting to stop, and the workflow ended `completed` with
-- nothing undone (outbox_workflow_finish, migration 21's, with that
-- condition, and outbox_workflow_settle, migration 25's, whose quick end
-- for workflows whose steps all completed now leaves cancelled ones to
-- the finish). A workflow without compensations whose running steps all
-- succeed still ends `completed`.
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
    -- Whether any attempt's run would go on, and those whose run's next
    -- task is still held under a claim of this batch (PROCESSING, or held
    -- in place: migration 43). Stuck-task
    -- recovery takes a run's waiting tasks back only with every other
    -- PROCESSING task of their claim and key (recover_stuck.sql): before
    -- this statement has locked the attempt's row, recovery may take it and
    -- the run's rest together, and the attempt is then not written; after,
    -- it takes nothing of the run. A run whose next task is gone ends here:
    -- its key is let go of.
    any_runs boolean := cardinality(continuing) > 0;
    running_on bigint[] := '{}';
    -- The plain path's arrays: the attempts found held, whether any needs
    -- more than a delete (a cancel asked for, a unique key covering
    -- COMPLETED), and what the delete took.
    plain_ids bigint[];
    any_special boolean;
    gone_ids bigint[];
    gone_queues text[];
    gone_keys text[];
    released_queues text[];
    released_keys text[];
BEGIN
    IF any_runs THEN
        SELECT coalesce(array_agg(c.id), '{}') INTO running_on
        FROM unnest(continuing, run_next) AS c(id, next)
        -- Each next task's row by its primary key alone: OFFSET 0 keeps
        -- the conditions below out of the lookup, where `state =
        -- 'processing'` would let the planner read the processing index
        -- whole (migration 34).
        CROSS JOIN LATERAL (SELECT f.state, f.claimed_by FROM outbox_tasks AS f
                            WHERE f.id = c.next OFFSET 0) AS f
        WHERE f.claimed_by IN (SELECT DISTINCT u.token FROM unnest(attempt_tokens) AS u(token));
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
    SELECT coalesce(array_agg(t.id), '{}'), coalesce(bool_or(t.special), false)
    INTO plain_ids, any_special
    FROM (SELECT * FROM unnest(attempt_ids, attempt_claims, attempt_tokens)
                        AS a(id, claims, token)
          ORDER BY a.id OFFSET 0) AS o
    CROSS JOIN LATERAL (
        SELECT t.id,
               (t.cancel_requested_at IS NOT NULL AND t.workflow_id IS NULL)
                   OR (NOT delete_all AND coalesce(t.unique_states & 8, 0) <> 0) AS special
        FROM outbox_tasks AS t
        WHERE t.id = o.id AND t.claims = o.claims AND t.claimed_by = o.token
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
                SELECT id, task_type, queue, payload, priority, retry_count, max_attempts, claims,
                       execute_at, created_at,
                       CASE WHEN runs_started
                            THEN coalesce(attempt_started[array_position(attempt_ids, gone.id)],
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
                WHERE t.id = o.id AND t.claims = o.claims AND t.claimed_by = o.token
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
                                    THEN coalesce(attempt_started[array_position(attempt_ids, t.id)],
                                                  t.attempted_at)
                                    ELSE t.attempted_at END,
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
                WHERE t.id = o.id AND t.claims = o.claims AND t.claimed_by = o.token
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
            SELECT id, task_type, queue, payload, priority, retry_count, max_attempts, claims,
                   execute_at, created_at,
                   CASE WHEN runs_started
                        THEN coalesce(attempt_started[array_position(attempt_ids, gone.id)], attempted_at)
                        ELSE attempted_at END,
                   coalesce(clock, clock_timestamp()), last_error,
                   NULL, unique_key, ordering_key, key_seq
            FROM gone
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
                                    THEN coalesce(attempt_started[array_position(attempt_ids, t.id)],
                                                  t.attempted_at)
                                    ELSE t.attempted_at END,
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

CREATE OR REPLACE FUNCTION outbox_workflow_finish(wf bigint) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    current text;
    cancelled boolean;
    forward_failed boolean;
    undoable boolean;
    undo_failed boolean;
    undos integer;
    first_undo text;
BEGIN
    SELECT state, cancelled_at IS NOT NULL INTO current, cancelled
    FROM outbox_workflows WHERE id = wf;
    SELECT coalesce(bool_or(compensates IS NULL AND state IN ('dead', 'cancelled')), false),
           coalesce(bool_or(compensates IS NOT NULL AND state IN ('dead', 'cancelled')), false),
           coalesce(bool_or(compensates IS NULL AND state = 'completed'
                            AND compensation IS NOT NULL), false)
    INTO forward_failed, undo_failed, undoable
    FROM outbox_workflow_steps
    WHERE workflow_id = wf;

    IF current = 'compensating' THEN
        UPDATE outbox_workflows
        SET state = CASE WHEN undo_failed THEN 'compensation_failed' ELSE 'compensated' END,
            finished_at = clock_timestamp(), updated_at = now()
        WHERE id = wf;
        RETURN;
    END IF;
    -- A saga an operator cancelled is undone even when every step it
    -- still ran succeeded (a cancel during its last steps stops nothing
    -- waiting): the cancel asked for the undo.
    IF NOT forward_failed AND NOT (cancelled AND undoable) THEN
        UPDATE outbox_workflows
        SET state = 'completed', finished_at = clock_timestamp(), updated_at = now()
        WHERE id = wf;
        RETURN;
    END IF;

    -- The undo chain: undo:<step> for every completed step with a
    -- compensation, latest completion first, each waiting on the one
    -- before it.
    WITH done AS (
        SELECT s.name, s.compensation,
               row_number() OVER (ORDER BY s.finished_at DESC, s.seq DESC) AS n,
               lag(s.name) OVER (ORDER BY s.finished_at DESC, s.seq DESC) AS undone_before
        FROM outbox_workflow_steps AS s
        WHERE s.workflow_id = wf AND s.compensates IS NULL
          AND s.state = 'completed' AND s.compensation IS NOT NULL
    ),
    base AS (
        SELECT max(seq) AS seq FROM outbox_workflow_steps WHERE workflow_id = wf
    ),
    added AS (
        INSERT INTO outbox_workflow_steps (workflow_id, name, seq, task_type, queue, payload,
                                           priority, max_attempts, compensates, parents,
                                           waiting_on, parent_names)
        SELECT wf, 'undo:' || done.name, base.seq + done.n::integer,
               done.compensation->>'task_type', done.compensation->>'queue',
               done.compensation->'payload', (done.compensation->>'priority')::smallint,
               (done.compensation->>'max_attempts')::integer, done.name,
               least(done.n - 1, 1), least(done.n - 1, 1),
               CASE WHEN done.undone_before IS NULL THEN '{}'
                    ELSE ARRAY['undo:' || done.undone_before] END
        FROM done, base
        RETURNING name, seq
    )
    SELECT count(*), (array_agg(name ORDER BY seq))[1] INTO undos, first_undo FROM added;

    IF undos = 0 THEN
        UPDATE outbox_workflows
        SET state = 'failed', finished_at = clock_timestamp(), updated_at = now()
        WHERE id = wf;
        RETURN;
    END IF;
    INSERT INTO outbox_workflow_edges (workflow_id, parent, child)
    SELECT wf, lag(name) OVER (ORDER BY seq), name
    FROM outbox_workflow_steps
    WHERE workflow_id = wf AND compensates IS NOT NULL
    ORDER BY seq
    OFFSET 1;
    UPDATE outbox_workflows
    SET state = 'compensating', steps = steps + undos, open_steps = undos, updated_at = now()
    WHERE id = wf;
    PERFORM outbox_workflow_release(wf, ARRAY[first_undo]);
END
$$;

CREATE OR REPLACE FUNCTION outbox_workflow_settle(wfs bigint[], names text[], ended_well boolean[]) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    f_wf bigint[] := wfs;
    f_name text[] := names;
    f_well boolean[] := ended_well;
    closed_wf bigint[] := wfs;
    next_wf bigint[];
    next_name text[];
    next_well boolean[];
    ready_wf bigint[];
    ready_name text[];
    ended bigint;
    ending bigint[];
    counted_wf bigint[];
    counted_n integer[];
    woke integer;
    dead_edges tid[];
    children tid[];
    bad_children jsonb;
    -- Whether bad_children has any: most settles have none, and skip the
    -- lookups.
    any_bad boolean;
    written bigint;
    counts jsonb;
    -- The sequence behind outbox_tasks.id, for the ids drawn below.
    task_ids regclass := pg_get_serial_sequence('outbox_tasks', 'id')::regclass;
BEGIN
    PERFORM 1 FROM outbox_workflows
    WHERE id = ANY (wfs)
    ORDER BY id
    FOR NO KEY UPDATE;
    WHILE cardinality(f_name) > 0 LOOP
        -- The frontier's edges not yet counted, each step's by the primary
        -- key, then the children they count, each by its own: the rows to
        -- write, by ctid; those a parent that died or was cancelled counts
        -- in (bad); and how many parents each counts now, by ctid.
        WITH edge AS MATERIALIZED (
            SELECT f.wf, e.child, f.well AS good, e.row_id
            FROM unnest(f_wf, f_name, f_well) AS f(wf, name, well)
            CROSS JOIN LATERAL (
                SELECT e.ctid AS row_id, e.child
                FROM outbox_workflow_edges AS e
                WHERE e.workflow_id = f.wf AND e.parent = f.name AND NOT e.settled
                OFFSET 0) AS e
        ),
        hits AS (
            SELECT edge.wf, edge.child, count(*) AS n, count(*) FILTER (WHERE NOT edge.good) AS bad
            FROM edge
            GROUP BY edge.wf, edge.child
        ),
        kids AS (
            SELECT s.row_id, hits.n, hits.bad
            FROM hits
            CROSS JOIN LATERAL (
                SELECT s.ctid AS row_id
                FROM outbox_workflow_steps AS s
                WHERE s.workflow_id = hits.wf AND s.name = hits.child AND s.state = 'waiting'
                OFFSET 0) AS s
        )
        SELECT (SELECT coalesce(array_agg(edge.row_id), '{}') FROM edge WHERE NOT edge.good),
               coalesce(array_agg(kids.row_id), '{}'),
               coalesce(jsonb_object_agg(kids.row_id::text, true) FILTER (WHERE kids.bad > 0), '{}'),
               coalesce(jsonb_object_agg(kids.row_id::text, kids.n), '{}')
        INTO dead_edges, children, bad_children, counts
        FROM kids;
        any_bad := bad_children <> '{}'::jsonb;
        -- A death is counted by marking its edges settled, so that the
        -- step's completion after an operator's retry (the only way a step
        -- reaches a final state twice) does not count again. A completion
        -- is final: its edges are read, not written.
        IF cardinality(dead_edges) > 0 THEN
            UPDATE outbox_workflow_edges SET settled = true WHERE ctid = ANY (dead_edges);
        END IF;
        -- Every counted parent leaves the child's count: a child that runs
        -- anyway waits for the rest, and one a dead parent cancels or
        -- skips is final (its count is not read again; an operator's retry
        -- recounts it). A child waiting on nothing more and without an
        -- ordering key is released in the same write: its task's id is
        -- drawn here and the task inserted with it below. Keyed children
        -- are released by outbox_workflow_release_steps, which inserts in
        -- key order.
        WITH changed AS (
            UPDATE outbox_workflow_steps AS s
            SET waiting_on = s.waiting_on - (counts ->> s.ctid::text)::integer,
                state = CASE WHEN any_bad AND bad_children ? s.ctid::text
                                  AND s.on_parent_dead = 'cancel' THEN 'cancelled'
                             WHEN any_bad AND bad_children ? s.ctid::text
                                  AND s.on_parent_dead = 'skip' THEN 'skipped'
                             WHEN s.ordering_key IS NULL
                                  AND s.waiting_on = (counts ->> s.ctid::text)::integer
                             THEN 'released'
                             ELSE s.state END,
                task_id = CASE WHEN (NOT (any_bad AND bad_children ? s.ctid::text)
                                     OR s.on_parent_dead = 'run')
                                    AND s.ordering_key IS NULL
                                    AND s.waiting_on = (counts ->> s.ctid::text)::integer
                               THEN nextval(task_ids) END,
                finished_at = CASE WHEN any_bad AND bad_children ? s.ctid::text
                                        AND s.on_parent_dead <> 'run'
                                   THEN clock_timestamp() END
            WHERE s.ctid = ANY (children) AND s.state = 'waiting'
            RETURNING s.*
        ),
        inserted AS (
            INSERT INTO outbox_tasks (id, task_type, queue, payload, priority, max_attempts,
                                      execute_at, skip_dead, workflow_id, workflow_step)
            OVERRIDING SYSTEM VALUE
            SELECT task_id, task_type, queue, payload, priority, max_attempts,
                   coalesce(run_at, now() + coalesce(delay_us, 0) * interval '1 microsecond'),
                   skip_dead, workflow_id, name
            FROM changed
            WHERE state = 'released'
            RETURNING queue, execute_at
        ),
        woken AS (
            SELECT pg_notify('outbox_tasks', q)
            FROM (SELECT DISTINCT queue AS q FROM inserted WHERE execute_at <= now()) AS due
        )
        SELECT coalesce(array_agg(workflow_id) FILTER (WHERE state IN ('cancelled', 'skipped')), '{}'),
               coalesce(array_agg(name) FILTER (WHERE state IN ('cancelled', 'skipped')), '{}'),
               coalesce(array_agg(state = 'skipped') FILTER (WHERE state IN ('cancelled', 'skipped')), '{}'),
               coalesce(array_agg(workflow_id) FILTER (WHERE state = 'waiting' AND waiting_on = 0), '{}'),
               coalesce(array_agg(name) FILTER (WHERE state = 'waiting' AND waiting_on = 0), '{}'),
               (SELECT count(*) FROM woken), count(*)
        INTO next_wf, next_name, next_well, ready_wf, ready_name, woke, written
        FROM changed;
        -- The workflows' rows are held: every child found is there to be
        -- written.
        IF written <> cardinality(children) THEN
            RAISE EXCEPTION 'outbox: % workflow steps found to count down, % written',
                cardinality(children), written;
        END IF;
        IF cardinality(ready_name) > 0 THEN
            PERFORM outbox_workflow_release_steps(ready_wf, ready_name);
        END IF;
        closed_wf := closed_wf || next_wf;
        f_wf := next_wf;
        f_name := next_name;
        f_well := next_well;
    END LOOP;
    -- Each workflow's open steps counted down; those with none left end:
    -- the usual end (running, no step dead or cancelled) for all of them
    -- at once, the others one by one (they fail or compensate). Rows are
    -- found by `id = ANY`, not by a join, which a planner that thinks the
    -- table empty could run by walking all of it for each workflow.
    SELECT array_agg(wf ORDER BY wf), array_agg(n ORDER BY wf)
    INTO counted_wf, counted_n
    FROM (SELECT wf, count(*)::integer AS n FROM unnest(closed_wf) AS wf GROUP BY wf) AS c;
    WITH written AS (
        UPDATE outbox_workflows AS w
        SET open_steps = w.open_steps - counted_n[array_position(counted_wf, w.id)],
            updated_at = now()
        WHERE w.id = ANY (counted_wf)
        RETURNING w.id, w.open_steps, w.finished_at
    )
    SELECT coalesce(array_agg(id) FILTER (WHERE open_steps = 0 AND finished_at IS NULL), '{}')
    INTO ending
    FROM written;
    IF cardinality(ending) = 0 THEN
        RETURN;
    END IF;
    WITH completed AS (
        UPDATE outbox_workflows AS w
        SET state = 'completed', finished_at = clock_timestamp()
        WHERE w.id = ANY (ending) AND w.state = 'running'
          -- A workflow an operator cancelled ends through the finish below,
          -- which undoes a saga (migration 48).
          AND w.cancelled_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM outbox_workflow_steps AS s
                          WHERE s.workflow_id = w.id AND s.state IN ('dead', 'cancelled'))
        RETURNING w.id
    )
    SELECT coalesce(array_agg(e ORDER BY e), '{}') INTO ending
    FROM unnest(ending) AS e
    WHERE e NOT IN (SELECT id FROM completed);
    FOREACH ended IN ARRAY ending LOOP
        PERFORM outbox_workflow_finish(ended);
    END LOOP;
END
$$;
