-- outbox: workflows. A workflow is a graph of steps, each a task, where a
-- step becomes a task only once every step it depends on has finished; a
-- saga's steps may declare a compensation task, and when a step dies the
-- completed steps' compensations run one after another in reverse order.
--
-- Design, and why:
--
-- * A waiting step is a row of outbox_workflow_steps, not a task: the task
--   row is inserted when the step is released. So the claim path, the
--   claim index and the ordering-key machinery know nothing of workflows,
--   and a plain task pays nothing for them.
-- * Progress is made by triggers on outbox_tasks that fire only for a
--   workflow's tasks (WHEN workflow_id IS NOT NULL, tested in C before any
--   function is called): a completion (the task row leaving for the
--   history), a death (dead_at set: failed out, cancelled, given up) and an
--   operator's retry (dead_at cleared). Every path that finishes a task,
--   the engine's or an operator's, moves the workflow on in the same
--   transaction: a worker killed between a parent's completion and its
--   dependents' release cannot exist, the two commit together.
-- * Each dependency is an edge row with a `settled` flag, each step counts
--   the edges it still waits on: a completion touches its own edges and its
--   children, never the whole workflow, so a 10,000-way fan-in costs 10,000
--   constant-time updates, not a quadratic scan.
-- * Everything that changes a workflow locks its row (an outcome after
--   writing its own released step), so the steps of one workflow change
--   one transaction at a time: two completions of a
--   chord's last two children cannot both see "no parent left", and two
--   releases of one step cannot happen.

-- Durable steps inside one handler (TaskContext::step): what each named
-- piece of work of a task returned, so a later attempt skips it. Kept
-- while the task is in outbox_tasks (dead ones included, for a retry);
-- maintenance deletes the rest.
CREATE TABLE outbox_durable_steps (
    task_id     bigint NOT NULL,
    name        text NOT NULL,
    result      jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, name)
);

ALTER TABLE outbox_tasks
    ADD COLUMN workflow_id bigint,
    ADD COLUMN workflow_step text;

CREATE TABLE outbox_workflows (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text NOT NULL,
    -- running: steps still to run; completed: every step completed (or was
    -- skipped); failed: a step died or was cancelled and there was nothing
    -- to compensate; compensating / compensated / compensation_failed: the
    -- saga's undo chain is running / ran / died (an operator's retry of the
    -- dead compensation resumes it).
    state        text NOT NULL DEFAULT 'running'
                 CHECK (state IN ('running', 'completed', 'failed', 'compensating',
                                  'compensated', 'compensation_failed')),
    steps        integer NOT NULL,
    -- Steps not in a final state (waiting or released): the workflow
    -- finishes when this reaches zero, without counting its steps.
    open_steps   integer NOT NULL CHECK (open_steps >= 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);

-- Maintenance deletes finished workflows after the history's retention.
CREATE INDEX outbox_workflows_finished_idx ON outbox_workflows (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE TABLE outbox_workflow_steps (
    workflow_id    bigint NOT NULL,
    name           text NOT NULL,
    -- Declaration order: compensations run in reverse completion order,
    -- ties broken by it; `workflows show` lists by it.
    seq            integer NOT NULL,
    -- The task the step becomes when released.
    task_type      text NOT NULL,
    queue          text NOT NULL,
    payload        jsonb NOT NULL,
    priority       smallint NOT NULL,
    max_attempts   integer NOT NULL,
    -- Counted from the release, unless run_at is set.
    delay_us       bigint,
    run_at         timestamptz,
    ordering_key   text,
    skip_dead      boolean NOT NULL DEFAULT false,
    -- What a dependency that died (or was cancelled) does to this step:
    -- cancel it, skip it (its own dependents go on), or run it anyway.
    on_parent_dead text NOT NULL DEFAULT 'cancel' CHECK (on_parent_dead IN ('cancel', 'skip', 'run')),
    -- For a compensation step: the step it undoes.
    compensates    text,
    -- For a forward step: its compensation task, {"task_type", "queue",
    -- "payload", "priority", "max_attempts"}, released only if the saga
    -- fails after this step completed.
    compensation   jsonb,
    -- Dependencies, and those not settled yet (see outbox_workflow_edges).
    parents        integer NOT NULL,
    waiting_on     integer NOT NULL,
    -- waiting: for its dependencies; released: its task exists (pending,
    -- running or retrying); completed, skipped, dead, cancelled: final.
    state          text NOT NULL DEFAULT 'waiting'
                   CHECK (state IN ('waiting', 'released', 'completed', 'skipped', 'dead', 'cancelled')),
    -- The step's task once released. What its handler returned
    -- (Outcome::success_with) is read from the history by this id when a
    -- handler or `workflows show` asks, not copied on the completion path.
    task_id        bigint,
    finished_at    timestamptz,
    PRIMARY KEY (workflow_id, name)
);

-- One row per dependency: `child` waits for `parent`. settled: the
-- parent's final state has been counted by the child.
CREATE TABLE outbox_workflow_edges (
    workflow_id bigint NOT NULL,
    parent      text NOT NULL,
    child       text NOT NULL,
    settled     boolean NOT NULL DEFAULT false,
    PRIMARY KEY (workflow_id, parent, child)
);

-- No foreign keys between the three tables: Workflow::validate checks the
-- graph before anything is written, the functions below are the only
-- writers, and maintenance deletes a workflow's rows together. A foreign
-- key check is a lookup per row (two per edge), planned once per session:
-- a plan made while the tables were small scanned them whole, and made a
-- workflow's submit 30 times slower once they had grown.

-- A step's parents, for its handler (parent_results) and `workflows show`.
CREATE INDEX outbox_workflow_edges_child_idx ON outbox_workflow_edges (workflow_id, child);

-- Turns the waiting steps `names` of workflow wf that wait on nothing into
-- tasks, and wakes the workers of their queues at commit. Call with the
-- workflow's row locked. Tasks with ordering keys are inserted in key
-- order, as a batch submit does, so two releases cannot deadlock on keys.
CREATE FUNCTION outbox_workflow_release(wf bigint, names text[]) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    released integer;
BEGIN
    IF cardinality(names) = 0 THEN
        RETURN 0;
    END IF;
    WITH ready AS (
        SELECT s.*
        FROM outbox_workflow_steps AS s
        WHERE s.workflow_id = wf AND s.name = ANY (names)
          AND s.state = 'waiting' AND s.waiting_on = 0
    ),
    inserted AS (
        INSERT INTO outbox_tasks (task_type, queue, payload, priority, max_attempts, execute_at,
                                  ordering_key, skip_dead, workflow_id, workflow_step)
        SELECT task_type, queue, payload, priority, max_attempts,
               coalesce(run_at, now() + coalesce(delay_us, 0) * interval '1 microsecond'),
               ordering_key, skip_dead, wf, name
        FROM ready
        ORDER BY ordering_key IS NOT NULL, queue COLLATE "C", ordering_key COLLATE "C", seq
        RETURNING id, queue, workflow_step, execute_at
    ),
    marked AS (
        UPDATE outbox_workflow_steps AS s
        SET state = 'released', task_id = inserted.id
        FROM inserted
        WHERE s.workflow_id = wf AND s.name = inserted.workflow_step
        RETURNING s.name
    ),
    woken AS (
        SELECT pg_notify('outbox_tasks', q)
        FROM (SELECT DISTINCT queue AS q FROM inserted WHERE execute_at <= now()) AS due
    )
    SELECT count(*) INTO released
    FROM marked
    WHERE (SELECT count(*) FROM woken) >= 0;
    RETURN released;
END
$$;

-- Ends workflow wf, whose last open step just reached a final state. A
-- forward step that died or was cancelled makes it fail; if completed
-- steps declared compensations, those are added as a chain of steps in
-- reverse completion order (the last to complete is undone first), the
-- first released, and the workflow is compensating instead. Call with the
-- workflow's row locked.
CREATE FUNCTION outbox_workflow_finish(wf bigint) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    current text;
    forward_failed boolean;
    undo_failed boolean;
    undos integer;
    first_undo text;
BEGIN
    SELECT state INTO current FROM outbox_workflows WHERE id = wf;
    SELECT coalesce(bool_or(compensates IS NULL AND state IN ('dead', 'cancelled')), false),
           coalesce(bool_or(compensates IS NOT NULL AND state IN ('dead', 'cancelled')), false)
    INTO forward_failed, undo_failed
    FROM outbox_workflow_steps
    WHERE workflow_id = wf;

    IF current = 'compensating' THEN
        UPDATE outbox_workflows
        SET state = CASE WHEN undo_failed THEN 'compensation_failed' ELSE 'compensated' END,
            finished_at = clock_timestamp(), updated_at = now()
        WHERE id = wf;
        RETURN;
    END IF;
    IF NOT forward_failed THEN
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
               row_number() OVER (ORDER BY s.finished_at DESC, s.seq DESC) AS n
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
                                           waiting_on)
        SELECT wf, 'undo:' || done.name, base.seq + done.n::integer,
               done.compensation->>'task_type', done.compensation->>'queue',
               done.compensation->'payload', (done.compensation->>'priority')::smallint,
               (done.compensation->>'max_attempts')::integer, done.name,
               least(done.n - 1, 1), least(done.n - 1, 1)
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

-- Moves workflow wf on after its steps `done` reached a final state
-- (completed, skipped, dead or cancelled) and were counted out of its open
-- steps, leaving `still_open`: each child counts the edge, a dead or
-- cancelled parent cancels or skips the children that say so (and those
-- in turn move their own children), children waiting on nothing more are
-- released, and the workflow ends when no step is open. Call with the
-- workflow's row locked and the steps' states written. Called from the
-- triggers below, whose settings (generic plans, index scans) it runs
-- under.
CREATE FUNCTION outbox_workflow_settle(wf bigint, done text[], still_open integer) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    frontier text[] := done;
    closed integer := 0;
    next_frontier text[];
    ready text[];
    left_open integer := still_open;
BEGIN
    WHILE cardinality(frontier) > 0 LOOP
        WITH counted AS (
            UPDATE outbox_workflow_edges AS e
            SET settled = true
            WHERE e.workflow_id = wf AND e.parent = ANY (frontier) AND NOT e.settled
            RETURNING e.parent, e.child
        ),
        hits AS (
            SELECT c.child,
                   count(*) FILTER (WHERE p.state IN ('completed', 'skipped')) AS good,
                   count(*) FILTER (WHERE p.state IN ('dead', 'cancelled')) AS bad
            FROM counted AS c
            JOIN outbox_workflow_steps AS p ON p.workflow_id = wf AND p.name = c.parent
            GROUP BY c.child
        ),
        changed AS (
            UPDATE outbox_workflow_steps AS s
            SET waiting_on = s.waiting_on - h.good
                             - CASE WHEN s.on_parent_dead = 'run' THEN h.bad ELSE 0 END,
                state = CASE WHEN h.bad > 0 AND s.on_parent_dead = 'cancel' THEN 'cancelled'
                             WHEN h.bad > 0 AND s.on_parent_dead = 'skip' THEN 'skipped'
                             ELSE s.state END,
                finished_at = CASE WHEN h.bad > 0 AND s.on_parent_dead <> 'run'
                                   THEN clock_timestamp() END
            FROM hits AS h
            WHERE s.workflow_id = wf AND s.name = h.child AND s.state = 'waiting'
            RETURNING s.name, s.state, s.waiting_on
        )
        SELECT coalesce(array_agg(name) FILTER (WHERE state IN ('cancelled', 'skipped')), '{}'),
               coalesce(array_agg(name) FILTER (WHERE state = 'waiting' AND waiting_on = 0), '{}')
        INTO next_frontier, ready
        FROM changed;
        IF cardinality(ready) > 0 THEN
            PERFORM outbox_workflow_release(wf, ready);
        END IF;
        closed := closed + cardinality(next_frontier);
        frontier := next_frontier;
    END LOOP;
    IF closed > 0 THEN
        -- Steps the cascade cancelled or skipped.
        UPDATE outbox_workflows
        SET open_steps = open_steps - closed
        WHERE id = wf
        RETURNING open_steps INTO left_open;
    END IF;
    IF left_open = 0 THEN
        PERFORM outbox_workflow_finish(wf);
    END IF;
END
$$;

-- Brings back the step whose task `task` an operator retried (its dead_at
-- cleared), with the steps its death had cancelled, if the workflow can go
-- on: a forward step while the workflow runs or failed, a compensation
-- while the compensation failed. Otherwise (the saga compensated, or is
-- compensating, meanwhile) the task runs on its own: it leaves the
-- workflow, whose record stays as it was.
CREATE FUNCTION outbox_workflow_revive(wf bigint, step text, task bigint) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    current text;
    undo boolean;
    frontier text[] := ARRAY[step];
    revived integer := 1;
    more text[];
BEGIN
    SELECT state INTO current FROM outbox_workflows WHERE id = wf FOR NO KEY UPDATE;
    SELECT compensates IS NOT NULL INTO undo
    FROM outbox_workflow_steps
    WHERE workflow_id = wf AND name = step AND task_id = task AND state = 'dead'
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF NOT ((NOT undo AND current IN ('running', 'failed'))
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
            SELECT DISTINCT e.child
            FROM outbox_workflow_edges AS e
            JOIN outbox_workflow_steps AS c ON c.workflow_id = wf AND c.name = e.child
            WHERE e.workflow_id = wf AND e.parent = ANY (frontier) AND c.state = 'cancelled'
              AND NOT EXISTS (
                  SELECT 1
                  FROM outbox_workflow_edges AS pe
                  JOIN outbox_workflow_steps AS p ON p.workflow_id = wf AND p.name = pe.parent
                  WHERE pe.workflow_id = wf AND pe.child = e.child
                    AND p.state IN ('dead', 'cancelled'))
        ),
        recounted AS (
            UPDATE outbox_workflow_edges AS e
            SET settled = p.state IN ('completed', 'skipped')
            FROM outbox_workflow_steps AS p
            WHERE e.workflow_id = wf AND e.child IN (SELECT child FROM candidates)
              AND p.workflow_id = wf AND p.name = e.parent
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

-- An operator cancels workflow wf: its waiting steps are cancelled (they
-- never run) and the tasks of its released steps are returned, for the
-- caller to cancel in the same transaction (cancel_tasks.sql; their deaths
-- then settle through the trigger below). If nothing is left open, the
-- workflow ends here (a saga compensates). No row: no such workflow.
CREATE FUNCTION outbox_workflow_cancel(wf bigint)
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
    SET open_steps = open_steps - steps_cancelled, updated_at = now()
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

-- A workflow task left outbox_tasks while running: it completed (the
-- outcome moved it to the history, with its result, in the same
-- statement; a retention of zero keeps no result).
--
-- The functions that run on the completion path say how they are planned:
-- generic plans (each statement is planned once per session, not at every
-- completion, which measured as much as the statements themselves) that
-- use the tables' indexes even when a session's first plan was made while
-- the tables were empty.
CREATE FUNCTION outbox_workflow_on_complete() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    still_open integer;
BEGIN
    -- The step first, then the workflow's row (locked by the update): a
    -- released step is changed only by its own task's outcome, so nothing
    -- else waits for it, and every transaction that changes the workflow's
    -- other steps holds that row.
    UPDATE outbox_workflow_steps
    SET state = 'completed', finished_at = clock_timestamp()
    WHERE workflow_id = OLD.workflow_id AND name = OLD.workflow_step
      AND task_id = OLD.id AND state = 'released';
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE outbox_workflows
    SET open_steps = open_steps - 1, updated_at = now()
    WHERE id = OLD.workflow_id
    RETURNING open_steps INTO still_open;
    PERFORM outbox_workflow_settle(OLD.workflow_id, ARRAY[OLD.workflow_step], still_open);
    RETURN NULL;
END
$$;

-- A workflow task died (dead_at set) or an operator retried it (cleared).
CREATE FUNCTION outbox_workflow_on_dead() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    still_open integer;
BEGIN
    IF NEW.dead_at IS NULL THEN
        PERFORM outbox_workflow_revive(NEW.workflow_id, NEW.workflow_step, NEW.id);
        RETURN NULL;
    END IF;
    UPDATE outbox_workflow_steps
    SET state = 'dead', finished_at = clock_timestamp()
    WHERE workflow_id = NEW.workflow_id AND name = NEW.workflow_step
      AND task_id = NEW.id AND state = 'released';
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE outbox_workflows
    SET open_steps = open_steps - 1, updated_at = now()
    WHERE id = NEW.workflow_id
    RETURNING open_steps INTO still_open;
    PERFORM outbox_workflow_settle(NEW.workflow_id, ARRAY[NEW.workflow_step], still_open);
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_workflow_complete
    AFTER DELETE ON outbox_tasks
    FOR EACH ROW WHEN (OLD.workflow_id IS NOT NULL AND OLD.state = 'processing')
    EXECUTE FUNCTION outbox_workflow_on_complete();

CREATE TRIGGER outbox_workflow_dead
    AFTER UPDATE OF dead_at ON outbox_tasks
    FOR EACH ROW WHEN (OLD.workflow_id IS NOT NULL AND OLD.dead_at IS DISTINCT FROM NEW.dead_at)
    EXECUTE FUNCTION outbox_workflow_on_dead();

-- Writes a workflow and releases the steps that depend on nothing, in the
-- caller's transaction (what outbox::Workflow::submit calls, after checking
-- names, edges and cycles: this function trusts its input). Arrays are one
-- entry per step, but for the edges (parent[i] -> child[i]). Returns the
-- workflow's id.
CREATE FUNCTION outbox_workflow_submit(
    workflow_name text, names text[], task_types text[], queues text[], payloads text[],
    priorities smallint[], max_attempts integer[], run_ats timestamptz[], delays_us bigint[],
    ordering_keys text[], skip_deads boolean[], on_parent_deads text[], compensations text[],
    edge_parents text[], edge_children text[]
) RETURNS bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    wf bigint;
    roots text[];
BEGIN
    INSERT INTO outbox_workflows (name, steps, open_steps)
    VALUES (workflow_name, cardinality(names), cardinality(names))
    RETURNING id INTO wf;
    INSERT INTO outbox_workflow_steps (workflow_id, name, seq, task_type, queue, payload, priority,
                                       max_attempts, run_at, delay_us, ordering_key, skip_dead,
                                       on_parent_dead, compensation, parents, waiting_on)
    SELECT wf, s.name, s.seq::integer, s.task_type, s.queue, s.payload::jsonb, s.priority,
           s.max_attempts, s.run_at, s.delay_us, s.ordering_key, s.skip_dead,
           s.on_parent_dead, s.compensation::jsonb, coalesce(d.n, 0), coalesce(d.n, 0)
    FROM unnest(names, task_types, queues, payloads, priorities, max_attempts, run_ats,
                delays_us, ordering_keys, skip_deads, on_parent_deads, compensations)
         WITH ORDINALITY
         AS s(name, task_type, queue, payload, priority, max_attempts, run_at, delay_us,
              ordering_key, skip_dead, on_parent_dead, compensation, seq)
    LEFT JOIN (SELECT c AS child, count(*)::integer AS n
               FROM unnest(edge_children) AS c GROUP BY c) AS d ON d.child = s.name;
    INSERT INTO outbox_workflow_edges (workflow_id, parent, child)
    SELECT wf, p, c FROM unnest(edge_parents, edge_children) AS e(p, c);
    SELECT coalesce(array_agg(name), '{}') INTO roots
    FROM outbox_workflow_steps
    WHERE workflow_id = wf AND waiting_on = 0;
    PERFORM outbox_workflow_release(wf, roots);
    RETURN wf;
END
$$;
