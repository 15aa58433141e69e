-- Stuck-task recovery: PROCESSING tasks whose worker stopped heartbeating
-- (their heartbeat a timeout old, and the worker's row expired) become
-- claimable again at once. It counts as a failed attempt, so a task
-- that kills its worker every time ends dead instead of looping forever;
-- the tasks of a run go back to their key's line without one (below).
-- $1 heartbeat timeout in microseconds, $2 batch size, $3 clock override,
-- $4 the maintenance leader running it (null for a direct call): the
-- statement then changes nothing unless $4 still holds the maintenance
-- lease, so a leader that went silent and lost its lease cannot act on
-- what it saw before.
WITH candidates AS (
    SELECT id, queue, ordering_key, claimed_by, blocked, key_seq, run_from
    FROM outbox_tasks
    WHERE state = 'processing'
      AND heartbeat_at < coalesce($3::timestamptz, now()) - $1 * interval '1 microsecond'
      -- And its worker is gone: no live row (each worker keeps its row
      -- alive for three of its own heartbeat intervals). The timeout is
      -- the leader's; a worker that heartbeats more slowly than the leader
      -- expects is alive all the same, and its tasks were taken from it
      -- and run twice.
      AND NOT EXISTS (
            SELECT 1 FROM outbox_workers AS w
            WHERE w.expires_at > coalesce($3::timestamptz, now())
              AND left(outbox_tasks.claimed_by, length(w.id) + 1) = w.id || '/')
      AND ($4::text IS NULL OR EXISTS (
            SELECT 1 FROM outbox_leases
            WHERE name = 'maintenance' AND holder = $4 AND expires_at > now()))
    ORDER BY heartbeat_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
-- A task of a run (PROCESSING and still blocked, migration 28) goes back
-- only with every other PROCESSING task of its claim and key: one left
-- out (its outcome in flight holds it, or this batch's limit cut the run)
-- may still be done with the key by its worker, whose outcome then keeps
-- it for the run's next task, or lets it go on. The next round takes it.
-- The tasks of a run held in place (PENDING, blocked, under the run's
-- claim: migration 43) go back to their line with the run's last task,
-- which is PROCESSING under the same claim and key and carries the run's
-- heartbeat; none of them counts an attempt.
--
-- The tasks a run holds without a write (migration 56: between where it
-- starts and its last task) are locked here without waiting, and a run
-- with one locked elsewhere waits for the next round too: its outcome in
-- flight (it then goes on with the run, which must still be whole when it
-- commits), or an operator's cancel (seen next round). Taken back, they
-- wait in their line as they did, the key going to the first of them,
-- with the run's claim counted (as migration 43 counted it), so that a
-- late attempt of the run's worker, which carries that count, is refused
-- whatever it finds of the run when it is written; one an operator asked
-- to cancel is dead.
unwritten AS (
    SELECT c.id AS last_id, w.id, w.cancel_requested_at IS NOT NULL AS cancel
    FROM candidates AS c
    JOIN outbox_tasks AS w
      ON w.queue = c.queue AND w.ordering_key = c.ordering_key AND w.blocked
     AND w.key_seq >= c.run_from AND w.key_seq < c.key_seq
     AND w.state = 'pending' AND w.claimed_by IS NULL
    WHERE c.blocked
    FOR UPDATE OF w SKIP LOCKED
),
unwritten_all AS (
    SELECT c.id AS last_id, count(*) AS n
    FROM candidates AS c
    JOIN outbox_tasks AS w
      ON w.queue = c.queue AND w.ordering_key = c.ordering_key AND w.blocked
     AND w.key_seq >= c.run_from AND w.key_seq < c.key_seq
     AND w.state = 'pending' AND w.claimed_by IS NULL
    WHERE c.blocked
    GROUP BY c.id
),
stuck AS (
    SELECT c.id FROM candidates AS c
    WHERE (NOT c.blocked
           OR NOT EXISTS (
                SELECT 1 FROM outbox_tasks AS e
                WHERE e.queue = c.queue AND e.ordering_key = c.ordering_key
                  AND e.state = 'processing' AND e.claimed_by = c.claimed_by
                  -- Always true of a PROCESSING task, but PostgreSQL cannot
                  -- prove it: stated so the key holders' index serves the probe.
                  AND (e.dead_at IS NULL OR NOT e.skip_dead)
                  AND e.id NOT IN (SELECT a.id FROM candidates AS a)))
      AND (NOT c.blocked
           OR (SELECT count(*) FROM unwritten AS u WHERE u.last_id = c.id)
              = coalesce((SELECT a.n FROM unwritten_all AS a WHERE a.last_id = c.id), 0))
),
-- The tasks held in place of each stuck run's last task (same claim, same
-- key), read here and written with it below.
held AS (
    SELECT w.id
    FROM candidates AS c
    JOIN outbox_tasks AS w
      ON w.queue = c.queue AND w.ordering_key = c.ordering_key AND w.blocked
     AND w.state = 'pending' AND w.claimed_by = c.claimed_by
    WHERE c.blocked AND c.id IN (SELECT stuck.id FROM stuck)
    UNION ALL
    SELECT u.id FROM unwritten AS u
    WHERE u.last_id IN (SELECT stuck.id FROM stuck)
),
done AS (
    -- A task of a run (still blocked, migration 28) goes back to its key's
    -- line without counting an attempt: it may never have started. The
    -- key then goes to the first task in line, counting attempts from
    -- there on, so a task that kills its worker every time still ends dead.
    UPDATE outbox_tasks AS t
    SET state = CASE WHEN t.blocked AND t.cancel_requested_at IS NULL THEN 'pending'
                     ELSE 'failed' END::outbox_task_state,
        retry_count = t.retry_count + CASE WHEN t.blocked THEN 0 ELSE 1 END,
        dead_at = CASE WHEN t.cancel_requested_at IS NOT NULL
                         OR (NOT t.blocked AND t.retry_count + 1 >= t.max_attempts)
                       THEN coalesce($3::timestamptz, now()) END,
        -- A task held without a write keeps its moment (it was due when its
        -- run took it).
        execute_at = CASE WHEN t.claimed_by IS NULL AND t.cancel_requested_at IS NULL
                          THEN t.execute_at ELSE coalesce($3::timestamptz, now()) END,
        last_error = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'cancelled by an operator'
                          WHEN t.blocked THEN t.last_error
                     ELSE 'worker lost (heartbeat expired): ' || coalesce(t.claimed_by, 'unknown worker')
                          || ' last heartbeat at ' || coalesce(t.heartbeat_at::text, 'never') END,
        finished_at = CASE WHEN t.blocked AND t.cancel_requested_at IS NULL THEN NULL
                           ELSE coalesce($3::timestamptz, now()) END,
        -- Cancelled, it is dead and leaves its key's line.
        blocked = t.blocked AND t.cancel_requested_at IS NULL,
        -- The run's claim counted for a task it held without a write (above).
        claims = t.claims + CASE WHEN t.claimed_by IS NULL THEN 1 ELSE 0 END,
        claimed_by = NULL,
        heartbeat_at = NULL,
        updated_at = coalesce($3::timestamptz, now())
    -- By `id = ANY`, not a join with `stuck`, which statistics taken while
    -- the task table was empty could plan as a walk of the whole table
    -- (migration 27).
    WHERE t.id = ANY (ARRAY(SELECT stuck.id FROM stuck UNION ALL SELECT held.id FROM held))
      -- Checked again once locked: a held task's claim may have ended
      -- meanwhile (its run given back, then claimed anew).
      AND (t.claimed_by IN (SELECT c.claimed_by FROM candidates AS c)
           -- Held without a write (above); its cancel is read at its latest
           -- once locked, as in release_run.sql.
           OR t.claimed_by IS NULL AND t.state = 'pending' AND t.blocked)
    RETURNING t.id, t.dead_at IS NOT NULL AS dead, t.queue, t.ordering_key, t.state, t.dead_at, t.skip_dead, t.blocked
),
handed AS (
    -- Tasks that let go of their ordering key hand it on (after every row
    -- above is written: the aggregate reads them all first).
    SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key)) AS n
    FROM done
    WHERE ordering_key IS NOT NULL
      AND (NOT (state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead))
           -- A task of a run (migration 28): its key goes to the first
           -- task left in its line, if nothing holds it.
           OR blocked)
    HAVING count(*) > 0
)
SELECT id, dead FROM done WHERE (SELECT count(*) FROM handed) >= 0
