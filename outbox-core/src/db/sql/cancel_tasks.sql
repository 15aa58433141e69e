-- Operator cancel. Tasks that are not running (PENDING, or FAILED and
-- waiting to retry) become dead at once (FAILED, never claimed again, kept
-- for the record). Running tasks (PROCESSING, or held in place in a run:
-- migration 43) are marked, and the worker holding each is told on the
-- control channel; whatever their attempt writes afterwards, they end
-- dead. A cancelled task lets its ordering key go on (skip_dead), and so
-- does a dead task with an ordering key that an operator cancels: that is
-- how a dead head is skipped. Finished tasks are
-- left alone. $1 ids; $2 those cancel_lock.sql judged waiting (a keyed
-- task judged running there is asked to cancel here, whatever it looks
-- like now: migration 56). Returns the ids cancelled, asked to cancel or
-- skipped.
--
-- It runs after cancel_lock.sql, in the same transaction, which locks the
-- ordering keys of the tasks it hands on (those not running) and then the
-- tasks, so that this statement's snapshot, taken after, sees each task as
-- it is under the lock. On its own (it used to take the keys itself),
-- this statement judged a task changed by a transaction that committed
-- while it waited (claimed, failed for a retry, recovered) by its state
-- before the wait, which every CTE's scan reads, and none of the updates
-- matched it: the cancel was lost. A task that stopped running while the
-- cancel waited has its key taken by the hand-over below, after the task:
-- the order of the statements that end a running task (its outcome,
-- recovery).
WITH waiting AS (
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
      -- Not a task of a run held in place (migrations 43 and 56): that
      -- one is marked below like a running task.
      AND claimed_by IS NULL
      AND NOT (outbox_tasks.claimed_by IS NULL AND outbox_tasks.blocked AND outbox_tasks.state = 'pending'
               AND outbox_run_claim(outbox_tasks.queue, outbox_tasks.ordering_key, outbox_tasks.key_seq) IS NOT NULL)
      AND (ordering_key IS NULL OR id = ANY($2::bigint[]))
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
      -- IS TRUE: by primary key, never the running tasks' index read
      -- whole (heartbeat.sql says why).
      AND ((state = 'processing' OR claimed_by IS NOT NULL) IS TRUE
           OR outbox_tasks.claimed_by IS NULL AND outbox_tasks.blocked AND outbox_tasks.state = 'pending'
              AND outbox_run_claim(outbox_tasks.queue, outbox_tasks.ordering_key, outbox_tasks.key_seq) IS NOT NULL
           -- Judged running by cancel_lock.sql, waiting now: its run ended
           -- in between, and a claim may be taking it into a new one.
           OR ordering_key IS NOT NULL AND id <> ALL ($2::bigint[])
              AND state IN ('pending', 'failed') AND dead_at IS NULL)
      AND cancel_requested_at IS NULL
    RETURNING id
),
skipped AS (
    UPDATE outbox_tasks
    SET skip_dead = true,
        dead_at = dead_at,
        updated_at = now()
    WHERE id = ANY($1::bigint[])
      -- The same for the dead tasks' indexes.
      AND (dead_at IS NOT NULL) IS TRUE
      AND ordering_key IS NOT NULL
      AND NOT skip_dead
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
