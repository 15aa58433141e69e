-- Outcomes of runs without a lookup per row that reads the whole batch
-- (issue 23, item 5).
--
-- An outcome batch that carries tasks of runs (migration 28) sends when
-- each started, in an array parallel to the attempts' ids, and each
-- history row took its task's moment with array_position(attempt_ids,
-- id): a walk of the batch for every row, one comparison through the
-- function manager per element, so a cost that grows with the square of
-- the batch. `perf` put that walk (array_iterate, int8eq,
-- FunctionCall2Coll) at 4% of the machine's CPU in the bench's drain over
-- 1,000 keys, whose batches are uneven (PERFORMANCE.md, "Outcomes of runs
-- joined by id").
--
-- Now the usual batch, when it has more than 16 attempts, joins the starts
-- to its rows once, and the statement for batches with a cancel or a
-- unique key does at every size. The join is by attempt (id, claims and
-- claim token), so a row takes the start of the attempt that was written:
-- the lookup took the first attempt of the same task in the batch (a
-- stale one, when a lost claim's attempt and the task's next attempt end
-- in one batch). A usual batch of 16 or fewer keeps the lookup, which
-- costs less there than setting up the join (a hot key's outcomes come one
-- at a time). outbox_hold_runs found each returned task's head the same
-- way, and joins it now. The rare rows a cancel or a unique key keeps in
-- the table still look their moment up row by row: an UPDATE finds its
-- rows by `id = ANY`, never by a join (migration 27), and only those rows
-- pay it. Otherwise the functions are migration 48's and migration 46's.
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
                       gone.claims, execute_at, created_at, coalesce(a.started, attempted_at),
                       coalesce(clock, clock_timestamp()), last_error,
                       NULL, unique_key, ordering_key, key_seq
                FROM gone
                LEFT JOIN (SELECT a.id, a.claims, a.token, min(a.started) AS started
                           FROM unnest(attempt_ids, attempt_claims, attempt_tokens,
                                       attempt_started) AS a(id, claims, token, started)
                           GROUP BY a.id, a.claims, a.token) AS a
                       ON a.id = gone.id AND a.claims = gone.claims
                      AND a.token = gone.claimed_by
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
            SELECT gone.id, task_type, queue, payload, priority, retry_count, max_attempts,
                   gone.claims, execute_at, created_at, coalesce(a.started, attempted_at),
                   coalesce(clock, clock_timestamp()), last_error,
                   NULL, unique_key, ordering_key, key_seq
            FROM gone
            -- Joined by attempt, as in the usual batch above, whatever the
            -- batch's size (attempt_started is null unless the batch carries
            -- tasks of runs, and every start is then null).
            LEFT JOIN (SELECT a.id, a.claims, a.token, min(a.started) AS started
                       FROM unnest(attempt_ids, attempt_claims, attempt_tokens,
                                   attempt_started) AS a(id, claims, token, started)
                       GROUP BY a.id, a.claims, a.token) AS a
                   ON a.id = gone.id AND a.claims = gone.claims
                  AND a.token = gone.claimed_by
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

CREATE OR REPLACE FUNCTION outbox_hold_runs(heads bigint[], token text, run_length integer,
                                 clock timestamptz)
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
BEGIN
    IF run_length IS NULL OR run_length < 2 OR cardinality(heads) = 0 THEN
        RETURN;
    END IF;
    WITH head AS (
        -- Each head's row by its primary key (OFFSET 0: the conditions stay
        -- out of the lookup, as in outbox_complete_tasks).
        SELECT h.id, h.queue, h.ordering_key
        FROM unnest(heads) AS x(id)
        CROSS JOIN LATERAL (SELECT t.id, t.queue, t.ordering_key, t.claimed_by
                            FROM outbox_tasks AS t WHERE t.id = x.id OFFSET 0) AS h
        WHERE h.claimed_by = token AND h.ordering_key IS NOT NULL
          AND coalesce((SELECT s.per_key_concurrency FROM outbox_queues AS s
                        WHERE s.name = h.queue), 1) = 1
    ),
    line AS MATERIALIZED (
        SELECT head.id AS head, w.id, w.key_seq, w.ok
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
    -- Locked without waiting: a task another transaction is changing (an
    -- operator's cancel, say) ends the run before it. The line was read
    -- first, unlocked, so that such a task leaves no unseen gap.
    locked AS MATERIALIZED (
        SELECT t.id
        FROM outbox_tasks AS t
        WHERE t.id = ANY (ARRAY(SELECT line.id FROM line WHERE line.ok))
          AND t.blocked IS TRUE AND t.state = 'pending' AND t.dead_at IS NULL
          AND t.claimed_by IS NULL
        FOR UPDATE SKIP LOCKED
    ),
    run AS (
        SELECT line.id, line.head, line.key_seq,
               bool_and(line.ok AND locked.id IS NOT NULL)
                   OVER (PARTITION BY line.head ORDER BY line.key_seq) AS taken
        FROM line LEFT JOIN locked ON locked.id = line.id
    ),
    taken AS MATERIALIZED (
        SELECT run.id, run.head, run.key_seq = max(run.key_seq) OVER (PARTITION BY run.head) AS last
        FROM run WHERE run.taken
    )
    SELECT coalesce(array_agg(taken.id), '{}'), coalesce(array_agg(taken.head), '{}'),
           coalesce(array_agg(taken.id) FILTER (WHERE taken.last), '{}')
    INTO follower_ids, follower_heads, last_ids
    FROM taken;
    IF cardinality(follower_ids) = 0 THEN
        RETURN;
    END IF;
    -- Written found by `id = ANY`, never by a join (migration 27). A task
    -- of a run is attempted when it starts: its outcome writes the moment.
    -- Each row's head is joined by id once (migration 55).
    RETURN QUERY
    WITH held AS (
        UPDATE outbox_tasks AS t
        SET state = CASE WHEN t.id = ANY (last_ids) THEN 'processing' ELSE t.state END,
            claims = t.claims + 1,
            claimed_by = token,
            heartbeat_at = CASE WHEN t.id = ANY (last_ids) THEN coalesce(clock, now())
                                ELSE t.heartbeat_at END,
            updated_at = coalesce(clock, now())
        WHERE t.id = ANY (follower_ids)
        RETURNING t.id, t.task_type, t.queue, t.payload::text AS payload, t.retry_count,
                  t.max_attempts, t.claims, t.key_seq, t.created_at, t.trace_context,
                  t.workflow_id
    )
    SELECT f.head, held.id, held.task_type, held.queue, held.payload, held.retry_count,
           held.max_attempts, held.claims, held.key_seq, held.created_at, held.trace_context,
           held.workflow_id
    FROM held JOIN unnest(follower_ids, follower_heads) AS f(id, head) ON f.id = held.id;
END
$$;
