-- An operator's cancel of a workflow is final for its forward steps.
-- Before, outbox_workflow_revive judged an operator's retry of a dead
-- step's task by the workflow's state alone, and a cancelled workflow
-- without compensations ends `failed`, as one whose step died: the retry
-- of a step the cancel killed brought the workflow back to `running`, and
-- the steps below it that the cancel had stopped waited again and ran.
--
-- The cancel now marks a workflow that had not ended (cancelled_at, kept
-- on a second cancel), and a retried forward step of a marked workflow
-- runs its task on its own, as after a saga compensated: the task leaves
-- the workflow, whose record stays as it was. A retried compensation of a
-- cancelled saga still resumes the compensation, which the first cancel
-- asked for, with the compensation steps below it, even those a later
-- cancel stopped while the saga compensated: a retry of a compensation
-- asks for the undo to be done.
ALTER TABLE outbox_workflows ADD COLUMN cancelled_at timestamptz;

CREATE OR REPLACE FUNCTION outbox_workflow_cancel(wf bigint)
RETURNS TABLE (steps_cancelled integer, tasks bigint[])
LANGUAGE plpgsql
AS $$
DECLARE
    still_open integer;
BEGIN
    PERFORM 1 FROM outbox_workflows WHERE id = wf FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE outbox_workflow_steps
    SET state = 'cancelled', finished_at = clock_timestamp()
    WHERE workflow_id = wf AND state = 'waiting';
    GET DIAGNOSTICS steps_cancelled = ROW_COUNT;
    UPDATE outbox_workflows
    SET open_steps = open_steps - steps_cancelled, updated_at = now(),
        -- Only a workflow still running is cancelled: one that had ended
        -- is left as it was (`workflows cancel` says so).
        cancelled_at = CASE WHEN finished_at IS NULL
                            THEN coalesce(cancelled_at, clock_timestamp())
                            ELSE cancelled_at END
    WHERE id = wf
    RETURNING open_steps INTO still_open;
    IF still_open = 0 AND steps_cancelled > 0 THEN
        PERFORM outbox_workflow_finish(wf);
    END IF;
    SELECT coalesce(array_agg(task_id ORDER BY task_id), '{}') INTO tasks
    FROM outbox_workflow_steps
    WHERE workflow_id = wf AND state = 'released';
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION outbox_workflow_revive(wf bigint, step text, task bigint) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    current text;
    undo boolean;
    cancelled boolean;
    frontier text[] := ARRAY[step];
    revived integer := 1;
    more text[];
BEGIN
    SELECT state, cancelled_at IS NOT NULL INTO current, cancelled
    FROM outbox_workflows WHERE id = wf FOR NO KEY UPDATE;
    SELECT compensates IS NOT NULL INTO undo
    FROM outbox_workflow_steps
    WHERE workflow_id = wf AND name = step AND task_id = task AND state = 'dead'
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF NOT ((NOT undo AND NOT cancelled AND current IN ('running', 'failed'))
            OR (undo AND current = 'compensation_failed')) THEN
        UPDATE outbox_tasks SET workflow_id = NULL, workflow_step = NULL WHERE id = task;
        RETURN;
    END IF;
    UPDATE outbox_workflow_steps
    SET state = 'released', finished_at = NULL
    WHERE workflow_id = wf AND name = step;
    LOOP
        -- Children the frontier's death cancelled, with no other dead or
        -- cancelled parent: they wait again, for whatever is unfinished.
        WITH candidates AS (
            SELECT DISTINCT c.name AS child, c.parent_names
            FROM outbox_workflow_edges AS e
            JOIN outbox_workflow_steps AS c ON c.workflow_id = wf AND c.name = e.child
            WHERE e.workflow_id = wf AND e.parent = ANY (frontier) AND c.state = 'cancelled'
              AND NOT EXISTS (
                  SELECT 1
                  FROM unnest(c.parent_names) AS pn(name)
                  JOIN outbox_workflow_steps AS p ON p.workflow_id = wf AND p.name = pn.name
                  WHERE p.state IN ('dead', 'cancelled'))
        ),
        recounted AS (
            UPDATE outbox_workflow_edges AS e
            SET settled = p.state IN ('completed', 'skipped')
            FROM candidates AS c
            CROSS JOIN LATERAL unnest(c.parent_names) AS pn(name)
            JOIN outbox_workflow_steps AS p ON p.workflow_id = wf AND p.name = pn.name
            WHERE e.workflow_id = wf AND e.parent = pn.name AND e.child = c.child
            RETURNING e.child, e.settled
        ),
        waiting AS (
            UPDATE outbox_workflow_steps AS s
            SET state = 'waiting', finished_at = NULL,
                waiting_on = (SELECT count(*) FROM recounted AS r
                              WHERE r.child = s.name AND NOT r.settled)
            WHERE s.workflow_id = wf AND s.name IN (SELECT child FROM candidates)
            RETURNING s.name
        )
        SELECT coalesce(array_agg(name), '{}') INTO more FROM waiting;
        EXIT WHEN cardinality(more) = 0;
        revived := revived + cardinality(more);
        frontier := more;
    END LOOP;
    -- The revived step's edges to children that counted its death (run
    -- anyway, skip) stay settled: its completion must not count twice.
    UPDATE outbox_workflows
    SET state = CASE WHEN undo THEN 'compensating' ELSE 'running' END,
        open_steps = open_steps + revived, finished_at = NULL, updated_at = now()
    WHERE id = wf;
END
$$;
