-- A key handed on goes on in a run (issue 23, item 5).
--
-- An outcome that lets go of an ordering key may claim the key's next
-- task for its worker in the same statement (a hand-on, migration 17).
-- It claimed that task alone, so a key handed on went one task and one
-- hand-over at a time, slower than in runs (migration 28): the last task
-- of a run offered no place, its key went back to its line, and the
-- queue's producer, woken, claimed the key's next run. Between two runs
-- of a hot key that took about 4 ms (the let-go, a wake-up, a claim),
-- a fifth to a quarter of a run of 16 (PERFORMANCE.md, "A hot key's time,
-- task by task").
--
-- Now an outcome statement that offers places (hand_on_runs.sql) gives
-- the tasks it was handed to outbox_hold_runs, which claims the tasks
-- waiting behind each in its key's line, up to run_length tasks in all, as
-- a claim's runs are claimed (migration 43): the run's last task
-- PROCESSING, so that it holds the key until the run ends, and the tasks
-- between held in place (claimed_by and claims change, nothing indexed
-- does). A run stops at the first task in line that could not be claimed
-- now on its own (not due, failed before, dead, or locked by another
-- transaction), so it never steps over one; only where the queue runs one
-- task of a key at a time. A hot key of 10,000 tasks drained 5-25% faster
-- so (15% on the mean of five pairs), with a sixth less server time
-- (PERFORMANCE.md, "A key handed on in runs").
--
-- heads: the tasks the statement was handed, claimed under token (others
-- are skipped). Returns each task claimed, with the head of its run.
CREATE FUNCTION outbox_hold_runs(heads bigint[], token text, run_length integer,
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
    RETURN QUERY
    UPDATE outbox_tasks AS t
    SET state = CASE WHEN t.id = ANY (last_ids) THEN 'processing' ELSE t.state END,
        claims = t.claims + 1,
        claimed_by = token,
        heartbeat_at = CASE WHEN t.id = ANY (last_ids) THEN coalesce(clock, now())
                            ELSE t.heartbeat_at END,
        updated_at = coalesce(clock, now())
    WHERE t.id = ANY (follower_ids)
    RETURNING follower_heads[array_position(follower_ids, t.id)], t.id, t.task_type, t.queue,
              t.payload::text, t.retry_count, t.max_attempts, t.claims, t.key_seq,
              t.created_at, t.trace_context, t.workflow_id;
END
$$;
