-- Operator cancel. Tasks that are not running (PENDING, or FAILED and
-- waiting to retry) become dead at once (FAILED, never claimed again, kept
-- for the record). Running (PROCESSING) tasks are marked, and the worker
-- holding each is told on the control channel; whatever their attempt
-- writes afterwards, they end dead. A cancelled task lets its ordering key
-- go on (skip_dead), and so does a dead task with an ordering key that an
-- operator cancels: that is how a dead head is skipped. Finished tasks are
-- left alone. $1 ids. Returns the ids cancelled, asked to cancel or
-- skipped.
--
-- The ordering keys of the tasks it hands on (those not running) are
-- locked before any task is written. A hand-over locks a key and then
-- writes its next tasks; a cancel that wrote a waiting task first and
-- locked its key after could deadlock with it (PostgreSQL aborts one of
-- the two, and both are retried, but an operator's cancel should not fail
-- for it). Every update below waits for the keys (`(SELECT n FROM keys) >=
-- 0` is evaluated before its first row). A running task's key is not
-- taken: its cancel hands nothing on, and the statements that end a
-- running task (its outcome, recovery) lock the task before its key.
--
-- cancel_lock.sql runs first, in the same transaction: it takes the same
-- keys, then the tasks, in a statement of its own, so that this one's
-- snapshot, taken after, sees each task as it is under the lock. On its
-- own, this statement judged a task changed by a transaction that
-- committed while it waited (claimed, failed for a retry, recovered) by
-- its state before the wait, which every CTE's scan reads, and none of
-- the updates matched it: the cancel was lost.
WITH keys AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (
            SELECT t.queue, t.ordering_key FROM outbox_tasks AS t
            WHERE t.id = ANY($1::bigint[]) AND t.ordering_key IS NOT NULL
              AND t.state <> 'processing')
        ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
        FOR UPDATE OF o) AS l
),
waiting AS (
    UPDATE outbox_tasks
    SET state = 'failed',
        dead_at = now(),
        finished_at = now(),
        last_error = 'cancelled by an operator',
        skip_dead = true,
        -- Out of its key's line, if it was waiting in it.
        blocked = false,
        updated_at = now()
    WHERE id = ANY($1::bigint[])
      AND state IN ('pending', 'failed')
      AND dead_at IS NULL
      AND (SELECT n FROM keys) >= 0
    RETURNING id, queue, ordering_key
),
running AS (
    UPDATE outbox_tasks
    SET cancel_requested_at = now(),
        skip_dead = true,
        -- Unchanged; named so that the workflows' statement trigger (AFTER
        -- UPDATE OF dead_at) fires for this statement (migration 15).
        dead_at = dead_at,
        updated_at = now()
    WHERE id = ANY($1::bigint[])
      AND state = 'processing'
      AND cancel_requested_at IS NULL
      AND (SELECT n FROM keys) >= 0
    RETURNING id
),
skipped AS (
    UPDATE outbox_tasks
    SET skip_dead = true,
        dead_at = dead_at,
        updated_at = now()
    WHERE id = ANY($1::bigint[])
      AND dead_at IS NOT NULL
      AND ordering_key IS NOT NULL
      AND NOT skip_dead
      AND (SELECT n FROM keys) >= 0
    RETURNING id, queue, ordering_key
),
handed AS (
    -- Their keys go on, after every row above is written.
    SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key)) AS n
    FROM (SELECT queue, ordering_key FROM waiting UNION ALL SELECT queue, ordering_key FROM skipped) AS k
    WHERE ordering_key IS NOT NULL
    HAVING count(*) > 0
),
told AS (
    SELECT pg_notify('outbox_control', 'cancel:' || id) FROM running
)
SELECT id FROM waiting WHERE (SELECT count(*) FROM handed) >= 0
UNION ALL
SELECT id FROM skipped
UNION ALL
SELECT id FROM running WHERE (SELECT count(*) FROM told) >= 0
