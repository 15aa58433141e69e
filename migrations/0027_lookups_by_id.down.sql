-- Back to migration 26: the claim and outcome functions join the task
-- table with their lists by id.

CREATE OR REPLACE FUNCTION outbox_claim_tasks(q text, n bigint, token text, clock timestamptz,
                                   floor_priority smallint, floor_execute_at timestamptz,
                                   floor_id bigint, front_execute_at timestamptz,
                                   front_id bigint)
RETURNS TABLE (id bigint, task_type text, queue text, payload text, retry_count integer,
               max_attempts integer, claims integer, ordered boolean, key_seq bigint,
               created_at timestamptz, trace_context text, priority smallint,
               execute_at timestamptz, workflow_id bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    -- An operator's pause or limit waits for this claim; one that
    -- committed first is seen.
    PERFORM 1 FROM outbox_queues AS o
    WHERE o.name = q
      AND o.paused_at IS NULL AND o.global_concurrency IS NULL AND o.rate_per_second IS NULL
    FOR SHARE;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM outbox_queues AS o WHERE o.name = q) THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH next AS (
        (SELECT r.id FROM (
         SELECT t.id
         FROM outbox_tasks AS t
         WHERE t.queue = q
           AND t.state IN ('pending', 'failed') AND t.dead_at IS NULL AND NOT t.blocked
           AND t.execute_at <= coalesce(clock, now())
           AND t.priority < floor_priority
         ORDER BY t.priority, t.execute_at, t.id
         LIMIT n
         FOR UPDATE SKIP LOCKED) AS r)
        UNION ALL
        (SELECT r.id FROM (
         SELECT t.id
         FROM outbox_tasks AS t
         WHERE t.queue = q
           AND t.state IN ('pending', 'failed') AND t.dead_at IS NULL AND NOT t.blocked
           AND t.execute_at <= coalesce(clock, now())
           AND (t.priority, t.execute_at, t.id) > (floor_priority, floor_execute_at, floor_id)
         ORDER BY t.priority, t.execute_at, t.id
         LIMIT n
         FOR UPDATE SKIP LOCKED) AS r)
        UNION ALL
        (SELECT r.id FROM (
         SELECT t.id
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
    UPDATE outbox_tasks AS t
    SET state = 'processing',
        claims = t.claims + 1,
        claimed_by = token,
        heartbeat_at = coalesce(clock, now()),
        attempted_at = coalesce(clock, clock_timestamp()),
        updated_at = coalesce(clock, now())
    FROM next
    WHERE t.id = next.id
    RETURNING t.id, t.task_type, t.queue, t.payload::text, t.retry_count, t.max_attempts,
              t.claims, t.ordering_key IS NOT NULL, t.key_seq, t.created_at, t.trace_context,
              t.priority, t.execute_at, t.workflow_id;
END
$$;

CREATE OR REPLACE FUNCTION outbox_claim_limited(claim_queue text, wanted bigint, claim_token text,
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

CREATE OR REPLACE FUNCTION outbox_complete_tasks(attempt_ids bigint[], attempt_claims integer[],
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

CREATE OR REPLACE FUNCTION outbox_finish_tasks(attempt_ids bigint[], attempt_claims integer[],
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
