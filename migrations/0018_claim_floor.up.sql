-- The plain claim (a queue without limits) becomes a function, for two
-- reasons:
--   * It reads the claimable index from the producer's floor: a place in
--     the claim order (priority, execute_at, id) where its last claim
--     ended. It reads three ranges of the index one after the other until
--     it has n tasks, and the three cover the whole index:
--       1. a higher priority than the floor's;
--       2. above the floor;
--       3. the floor's priority at or below the floor: tasks that became
--          claimable behind it (a late commit, a retry due earlier, a
--          recovered task, a key's next task), from the front (front_*)
--          when one is given: the first task the producer's last walk of
--          the whole index found. It gives one only while such walks are
--          slow (a snapshot held for minutes keeps millions of entries in
--          the index), and walks the whole index again within at most
--          30 s.
--     A task claimed or finished since the oldest open snapshot keeps its
--     entry in the index while that snapshot lasts, so a claim that always
--     started at the front stepped over every task claimed since a long
--     report query or pg_dump began: a drain beside one slowed with its
--     square. Above the floor lie only the entries of claims since this
--     producer's last. The producer claims with no floor (the lowest
--     position) once a second, or while walks are slow often enough to
--     spend a twentieth of its time on them and at least every 30 s, so no
--     task waits behind the floor for long while the tasks above it keep
--     the worker busy. Each range repeats the predicate of
--     outbox_tasks_claimable_idx word for word, so that it reads that
--     index.
--   * Its plan is made once per session, with sequential and bitmap scans
--     and sorts off: the claim walks the claimable index in claim order
--     whatever the statistics say. A task table analyzed while empty (a
--     queue that had just drained) otherwise led the planner to sort the
--     whole backlog at every claim once a burst arrived: 135 ms a claim,
--     seen in the bench when the statement's plan was cached that way.
-- Claims up to n due tasks of queue q under claim token (written to
-- claimed_by), at clock (null: now(); attempted_at is clock_timestamp(),
-- the claim's own moment). Claims only while the queue's row in
-- outbox_queues says so (not paused, no global concurrency, no rate),
-- holding that row FOR SHARE meanwhile; a queue without a row has no
-- limits. The claim commits without waiting for its WAL flush (see
-- claim_tasks.sql).
CREATE FUNCTION outbox_claim_tasks(q text, n bigint, token text, clock timestamptz,
                                   floor_priority smallint, floor_execute_at timestamptz,
                                   floor_id bigint, front_execute_at timestamptz,
                                   front_id bigint)
RETURNS TABLE (id bigint, task_type text, queue text, payload text, retry_count integer,
               max_attempts integer, claims integer, ordered boolean, key_seq bigint,
               created_at timestamptz, trace_context text, priority smallint,
               execute_at timestamptz)
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
              t.priority, t.execute_at;
END
$$;
