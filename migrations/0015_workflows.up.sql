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
-- * Progress is made by triggers on outbox_tasks: row triggers that fire
--   only for a workflow's tasks (WHEN workflow_id IS NOT NULL, tested in C
--   before any function is called) note a completion (the task row leaving
--   for the history), a death (dead_at set: failed out, cancelled, given
--   up) or an operator's retry (dead_at cleared), and a statement trigger
--   settles what its statement noted, in one go (see the triggers below).
--   Every path that finishes a task, the engine's or an operator's, moves
--   the workflow on in the same transaction: a worker killed between a
--   parent's completion and its dependents' release cannot exist, the two
--   commit together.
-- * Each dependency is an edge row with a `settled` flag, each step counts
--   the edges it still waits on: a completion touches its own edges and its
--   children, never the whole workflow, so a 10,000-way fan-in costs 10,000
--   constant-time updates, not a quadratic scan.
-- * Everything that changes a workflow locks its row (an outcome after
--   writing its own released steps; several workflows in id order), so
--   the steps of one workflow change one transaction at a time: two
--   completions of a chord's last two children cannot both see "no parent
--   left", and two releases of one step cannot happen.

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

-- Signals sent to a task (outbox::signal) for TaskContext::wait_for: the
-- first of a name wins. Kept and deleted like the durable steps.
CREATE TABLE outbox_task_signals (
    task_id bigint NOT NULL,
    name    text NOT NULL,
    value   jsonb NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT now(),
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

-- Open workflows, for maintenance's safety net (outbox_workflow_sweep).
-- Updates that leave finished_at alone stay HOT.
CREATE INDEX outbox_workflows_open_idx ON outbox_workflows (id)
    WHERE finished_at IS NULL;

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

-- Turns the waiting steps (wfs[i], names[i]) that wait on nothing into
-- tasks, and wakes the workers of their queues at commit. Call with their
-- workflows' rows locked. Tasks with ordering keys are inserted in key
-- order, as a batch submit does, so two releases cannot deadlock on keys.
CREATE FUNCTION outbox_workflow_release_steps(wfs bigint[], names text[]) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    released integer;
BEGIN
    IF cardinality(names) = 0 THEN
        RETURN 0;
    END IF;
    WITH wanted AS (
        SELECT DISTINCT w.wf, w.name FROM unnest(wfs, names) AS w(wf, name)
    ),
    ready AS (
        SELECT s.*
        FROM wanted
        JOIN outbox_workflow_steps AS s ON s.workflow_id = wanted.wf AND s.name = wanted.name
        WHERE s.state = 'waiting' AND s.waiting_on = 0
    ),
    inserted AS (
        INSERT INTO outbox_tasks (task_type, queue, payload, priority, max_attempts, execute_at,
                                  ordering_key, skip_dead, workflow_id, workflow_step)
        SELECT task_type, queue, payload, priority, max_attempts,
               coalesce(run_at, now() + coalesce(delay_us, 0) * interval '1 microsecond'),
               ordering_key, skip_dead, workflow_id, name
        FROM ready
        ORDER BY ordering_key IS NOT NULL, queue COLLATE "C", ordering_key COLLATE "C",
                 workflow_id, seq
        RETURNING id, queue, workflow_id, workflow_step, execute_at
    ),
    marked AS (
        UPDATE outbox_workflow_steps AS s
        SET state = 'released', task_id = inserted.id
        FROM inserted
        WHERE s.workflow_id = inserted.workflow_id AND s.name = inserted.workflow_step
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

-- outbox_workflow_release_steps for steps `names` of one workflow.
CREATE FUNCTION outbox_workflow_release(wf bigint, names text[]) RETURNS integer
LANGUAGE sql
AS $$ SELECT outbox_workflow_release_steps(array_fill(wf, ARRAY[cardinality(names)]), names) $$;

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

-- Moves workflows on after their steps (wfs[i], names[i]) reached a
-- final state (completed, skipped, dead or cancelled), all at once: each
-- child counts its edges, a dead or cancelled parent cancels or skips the
-- children that say so (and those in turn move their own children),
-- children waiting on nothing more are released, and a workflow with no
-- open step left ends. Takes the workflows' rows (in id order, so that two
-- of these cannot deadlock) before it changes anything but `done`'s steps,
-- whose states the caller wrote. Runs under the trigger's settings below.
CREATE FUNCTION outbox_workflow_settle(wfs bigint[], names text[]) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    f_wf bigint[] := wfs;
    f_name text[] := names;
    closed_wf bigint[] := wfs;
    next_wf bigint[];
    next_name text[];
    ready_wf bigint[];
    ready_name text[];
    ended bigint;
BEGIN
    PERFORM 1 FROM outbox_workflows
    WHERE id IN (SELECT DISTINCT unnest(wfs))
    ORDER BY id
    FOR NO KEY UPDATE;
    WHILE cardinality(f_name) > 0 LOOP
        WITH frontier AS (
            SELECT DISTINCT f.wf, f.name FROM unnest(f_wf, f_name) AS f(wf, name)
        ),
        counted AS (
            UPDATE outbox_workflow_edges AS e
            SET settled = true
            FROM frontier
            WHERE e.workflow_id = frontier.wf AND e.parent = frontier.name AND NOT e.settled
            RETURNING e.workflow_id, e.parent, e.child
        ),
        hits AS (
            SELECT c.workflow_id, c.child,
                   count(*) FILTER (WHERE p.state IN ('completed', 'skipped')) AS good,
                   count(*) FILTER (WHERE p.state IN ('dead', 'cancelled')) AS bad
            FROM counted AS c
            JOIN outbox_workflow_steps AS p ON p.workflow_id = c.workflow_id AND p.name = c.parent
            GROUP BY c.workflow_id, c.child
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
            WHERE s.workflow_id = h.workflow_id AND s.name = h.child AND s.state = 'waiting'
            RETURNING s.workflow_id, s.name, s.state, s.waiting_on
        )
        SELECT coalesce(array_agg(workflow_id) FILTER (WHERE state IN ('cancelled', 'skipped')), '{}'),
               coalesce(array_agg(name) FILTER (WHERE state IN ('cancelled', 'skipped')), '{}'),
               coalesce(array_agg(workflow_id) FILTER (WHERE state = 'waiting' AND waiting_on = 0), '{}'),
               coalesce(array_agg(name) FILTER (WHERE state = 'waiting' AND waiting_on = 0), '{}')
        INTO next_wf, next_name, ready_wf, ready_name
        FROM changed;
        IF cardinality(ready_name) > 0 THEN
            PERFORM outbox_workflow_release_steps(ready_wf, ready_name);
        END IF;
        closed_wf := closed_wf || next_wf;
        f_wf := next_wf;
        f_name := next_name;
    END LOOP;
    UPDATE outbox_workflows AS w
    SET open_steps = w.open_steps - c.n, updated_at = now()
    FROM (SELECT wf, count(*)::integer AS n FROM unnest(closed_wf) AS wf GROUP BY wf) AS c
    WHERE w.id = c.wf;
    -- A workflow whose last open step closed here ends (in id order).
    FOR ended IN
        SELECT id FROM outbox_workflows
        WHERE id IN (SELECT DISTINCT unnest(closed_wf)) AND open_steps = 0 AND finished_at IS NULL
        ORDER BY id
    LOOP
        PERFORM outbox_workflow_finish(ended);
    END LOOP;
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

-- The triggers. A workflow task that left outbox_tasks while running
-- completed (the outcome moved it to the history, with its result, in the
-- same statement); one whose dead_at was set died (failed out, gave up,
-- cancelled); one whose dead_at was cleared was retried by an operator.
--
-- An outcome statement finishes a batch of tasks, so the work is done per
-- statement, not per row: a row trigger (guarded by WHEN in C, so a plain
-- task calls nothing) notes the step in a transaction-local setting, and
-- a statement trigger, after the statement's row triggers, settles all
-- the noted steps with a handful of set-based statements. A per-row settle
-- measured four times a plain task's cost per step; most of it was the
-- fixed cost of each small statement. The statement trigger of a plain
-- batch reads an empty setting and returns.
--
-- The settings the settle runs under: generic plans (each statement is
-- planned once per session, not at every batch) that use the tables'
-- indexes even when a session's first plan was made on empty tables.

-- Notes are "workflow/task/kind/step;" (kind c: completed, d: dead); a
-- step name holds no ';' (Workflow checks names; compensations are
-- "undo:" and a step's name).
CREATE FUNCTION outbox_workflow_note() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.dead_at IS NULL THEN
        -- An operator's retry: rare, done at once.
        PERFORM outbox_workflow_revive(NEW.workflow_id, NEW.workflow_step, NEW.id);
        RETURN NULL;
    END IF;
    PERFORM set_config('outbox.workflow_notes',
                       coalesce(current_setting('outbox.workflow_notes', true), '')
                       || OLD.workflow_id || '/' || OLD.id || '/'
                       || CASE WHEN TG_OP = 'DELETE' THEN 'c' ELSE 'd' END || '/'
                       || OLD.workflow_step || ';',
                       true);
    RETURN NULL;
END
$$;

CREATE FUNCTION outbox_workflow_flush() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    notes text := current_setting('outbox.workflow_notes', true);
BEGIN
    IF notes IS NULL OR notes = '' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('outbox.workflow_notes', '', true);
    PERFORM outbox_workflow_settle_notes(notes);
    RETURN NULL;
END
$$;

-- Writes the noted steps' final states (only steps still released by the
-- noted task: a stale note changes nothing) and settles them.
CREATE FUNCTION outbox_workflow_settle_notes(notes text) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    wfs bigint[];
    names text[];
BEGIN
    WITH noted AS (
        SELECT split_part(n, '/', 1)::bigint AS wf,
               split_part(n, '/', 2)::bigint AS task,
               split_part(n, '/', 3) AS kind,
               substr(n, length(split_part(n, '/', 1)) + length(split_part(n, '/', 2)) + 5) AS step
        FROM unnest(string_to_array(rtrim(notes, ';'), ';')) AS n
    ),
    closed AS (
        UPDATE outbox_workflow_steps AS s
        SET state = CASE WHEN noted.kind = 'c' THEN 'completed' ELSE 'dead' END,
            finished_at = clock_timestamp()
        FROM noted
        WHERE s.workflow_id = noted.wf AND s.name = noted.step
          AND s.task_id = noted.task AND s.state = 'released'
        RETURNING s.workflow_id, s.name
    )
    SELECT coalesce(array_agg(workflow_id), '{}'), coalesce(array_agg(name), '{}')
    INTO wfs, names
    FROM closed;
    IF cardinality(names) > 0 THEN
        PERFORM outbox_workflow_settle(wfs, names);
    END IF;
END
$$;

-- Maintenance's safety net: released steps of workflows unchanged for
-- `quiet_us` whose task finished without the workflow being told (a
-- statement that bypassed the triggers, such as one run with
-- session_replication_role = replica, or a hand-written one that broke the
-- rule above). A task gone to the history completed; a task dead, or gone
-- without a trace, died. Settles up to `max_steps`; returns how many.
CREATE FUNCTION outbox_workflow_sweep(quiet_us bigint, max_steps integer) RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    notes text;
    found integer;
BEGIN
    WITH missed AS (
        SELECT s.workflow_id, s.name, s.task_id,
               t.id IS NULL AND EXISTS (SELECT 1 FROM outbox_task_history AS h
                                        WHERE h.id = s.task_id) AS completed
        FROM outbox_workflows AS w
        JOIN outbox_workflow_steps AS s ON s.workflow_id = w.id AND s.state = 'released'
        LEFT JOIN outbox_tasks AS t ON t.id = s.task_id
        WHERE w.finished_at IS NULL
          AND w.updated_at < now() - quiet_us * interval '1 microsecond'
          AND (t.id IS NULL OR t.dead_at IS NOT NULL)
        LIMIT max_steps
    )
    SELECT string_agg(workflow_id || '/' || task_id || '/'
                      || CASE WHEN completed THEN 'c' ELSE 'd' END || '/' || name || ';', ''),
           count(*)
    INTO notes, found
    FROM missed;
    IF found > 0 THEN
        PERFORM outbox_workflow_settle_notes(notes);
    END IF;
    RETURN found;
END
$$;

CREATE TRIGGER outbox_workflow_complete
    AFTER DELETE ON outbox_tasks
    FOR EACH ROW WHEN (OLD.workflow_id IS NOT NULL AND OLD.state = 'processing')
    EXECUTE FUNCTION outbox_workflow_note();

CREATE TRIGGER outbox_workflow_dead
    AFTER UPDATE OF dead_at ON outbox_tasks
    FOR EACH ROW WHEN (OLD.workflow_id IS NOT NULL AND OLD.dead_at IS DISTINCT FROM NEW.dead_at)
    EXECUTE FUNCTION outbox_workflow_note();

CREATE TRIGGER outbox_workflow_flush_deleted
    AFTER DELETE ON outbox_tasks
    FOR EACH STATEMENT
    EXECUTE FUNCTION outbox_workflow_flush();

-- UPDATE OF dead_at, so that claims and heartbeats do not call it (a
-- trigger call per statement measured 2% of a plain drain each). Beware:
-- PostgreSQL fires a statement trigger once per table and event for a
-- whole query, as its last data-modifying part says, so a statement with
-- several UPDATEs of outbox_tasks must name dead_at in each of them
-- (cancel_tasks.sql sets dead_at = dead_at where it changes nothing).
CREATE TRIGGER outbox_workflow_flush_dead
    AFTER UPDATE OF dead_at ON outbox_tasks
    FOR EACH STATEMENT
    EXECUTE FUNCTION outbox_workflow_flush();

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
