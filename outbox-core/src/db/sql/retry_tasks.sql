-- Operator retry: FAILED tasks (dead, or waiting for their next attempt),
-- and COMPLETED ones kept here given by id, become claimable now with a
-- fresh attempt budget; tasks given by id that
-- are PENDING and due later (submitted with a delay, snoozed, a periodic
-- tick enqueued ahead) become due now, keeping their budget and their
-- place in their key's line, as River's JobRetry does for scheduled jobs.
-- Each queue that got a task is notified, so its workers look at once.
-- A forward step of a saga that compensates (or compensated), or of a
-- workflow an operator cancelled, is not retried: its effect would come
-- back after the compensations undid what came before it (a charge made
-- again after the refund). Its compensations can be retried. A unique task whose key
-- another live task holds meanwhile is left dead (retrying it would be the
-- duplicate its uniqueness forbids), and of several dead tasks of one key
-- retried together the first is retried and the rest stay dead (the
-- update reads the statement's snapshot, in which none of them holds the
-- key: all of them made live would break the unique index, and the whole
-- retry failed). $1 ids (null = every dead task), $2 task type filter for
-- the dead-task form (null = any).
-- Locks: the candidate tasks first, in id order, then their workflows in
-- id order, as an outcome does (its rows, then the workflows its statement
-- trigger settles, sorted by id): never the other way round, which could
-- deadlock with an outcome of the same workflow. A candidate a claim took
-- meanwhile is no longer FAILED once locked, and is left out.
WITH candidates AS (
    SELECT id, unique_key, workflow_id, workflow_step
    FROM outbox_tasks
    WHERE (state = 'failed'
           AND (($1::bigint[] IS NOT NULL AND id = ANY($1))
                OR ($1::bigint[] IS NULL AND dead_at IS NOT NULL
                    AND ($2::text IS NULL OR task_type = $2))))
       -- A completed task kept here (its uniqueness covers completed
       -- tasks) runs again when given by id; the history's are moved back
       -- by revive_completed.sql. Not a workflow's step.
       OR (state = 'completed' AND $1::bigint[] IS NOT NULL AND id = ANY($1)
           AND workflow_id IS NULL)
    ORDER BY id
    FOR UPDATE
),
-- The candidates' workflows, read as they are once locked: a saga that
-- began compensating while this statement waited is seen compensating.
workflows AS (
    SELECT w.id, w.state, w.cancelled_at
    FROM outbox_workflows AS w
    WHERE w.id IN (SELECT c.workflow_id FROM candidates AS c WHERE c.workflow_id IS NOT NULL)
    ORDER BY w.id
    FOR NO KEY UPDATE
),
halted AS (
    SELECT c.id
    FROM candidates AS c
    JOIN workflows AS w ON w.id = c.workflow_id
    JOIN outbox_workflow_steps AS s ON s.workflow_id = c.workflow_id AND s.name = c.workflow_step
    WHERE s.compensates IS NULL
      AND (w.state IN ('compensating', 'compensated', 'compensation_failed')
           OR w.cancelled_at IS NOT NULL)
),
chosen AS (
    SELECT id FROM candidates WHERE unique_key IS NULL AND id NOT IN (SELECT id FROM halted)
    UNION ALL
    SELECT min(id) FROM candidates
    WHERE unique_key IS NOT NULL AND id NOT IN (SELECT id FROM halted)
    GROUP BY unique_key
),
done AS (
    UPDATE outbox_tasks
    SET state = 'pending',
        retry_count = 0,
        dead_at = NULL,
        cancel_requested_at = NULL,
        finished_at = NULL,
        execute_at = now(),
        -- A task that had let its ordering key go on (skipped, or
        -- completed) queues for it again; one that held it (a dead head)
        -- holds it still; one still in its key's line (blocked) stays there.
        blocked = (ordering_key IS NOT NULL
                   AND (blocked OR (dead_at IS NOT NULL AND skip_dead) OR state = 'completed')),
        -- A completed task's result goes: the new run writes its own.
        result = CASE WHEN state = 'completed' THEN NULL ELSE result END,
        -- An operator's cancel set skip_dead to let the key go on past this
        -- death; retried, the task is its type's again (`on_dead = "skip"`
        -- as the workers declared it), so that dying again it holds its key
        -- unless its type skips. A type no worker declared holds it: the
        -- operator can skip it again.
        skip_dead = coalesce((SELECT d.skip_dead FROM outbox_task_types AS d
                              WHERE d.task_type = outbox_tasks.task_type), false),
        updated_at = now()
    WHERE id IN (SELECT id FROM chosen)
      AND state IN ('failed', 'completed')
      AND (unique_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM outbox_tasks AS holder
            WHERE holder.unique_key = outbox_tasks.unique_key
              AND holder.id <> outbox_tasks.id
              AND outbox_unique_covers(holder.unique_states, holder.state, holder.dead_at IS NOT NULL)))
    RETURNING id, queue, ordering_key, blocked
),
hurried AS (
    -- Not a task a run holds in place (claimed_by set): it starts with its
    -- run. Intake rows are always due now.
    UPDATE outbox_tasks
    -- dead_at named, unchanged: whether the workflows' statement trigger
    -- on `UPDATE OF dead_at` fires is decided by the statement's last
    -- UPDATE of the table (migration 15), which may be this one.
    SET execute_at = now(), updated_at = now(), dead_at = dead_at
    WHERE $1::bigint[] IS NOT NULL AND id = ANY($1)
      AND state = 'pending' AND claimed_by IS NULL
      AND execute_at > now()
    RETURNING id, queue
),
woken AS (
    SELECT count(pg_notify('outbox_tasks', q.queue)) AS n
    FROM (SELECT queue FROM done UNION SELECT queue FROM hurried) AS q
),
handed AS (
    -- Tasks back in their key's line get it if it is free.
    SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key)) AS n
    FROM done
    WHERE blocked
    HAVING count(*) > 0
)
-- The conditions only make sure the key hand-over and the notices run.
SELECT id FROM done WHERE (SELECT count(*) FROM handed) >= 0 AND (SELECT n FROM woken) >= 0
UNION ALL
SELECT id FROM hurried
