-- outbox: fewer writes per workflow step (issue 24). A step's drain cost
-- measured 2.2-2.7x a plain task's; most of it was writes the settle did
-- per step. What changes:
--
-- * A completion no longer marks its edges settled: it is final (only a
--   dead step comes back, by an operator's retry), so its edges are read.
--   A death still marks them, so that the completion after a retry does
--   not count it again; `settled` now means "a death counted" (or, after a
--   revive's recount, "a final parent counted").
-- * A child released by a settle takes its task id in the same write that
--   counts its last parent, and its task is inserted with that id: one
--   write of the step instead of two. Steps with an ordering key keep the
--   old path (outbox_workflow_release_steps inserts in key order, so that
--   two releases cannot deadlock on keys).
-- * The workflows a statement touched have their open-step counts written
--   in one statement, and those that completed (the usual end) are ended
--   in another, found by `id = ANY` rather than by joins a planner could
--   get wrong; only workflows that fail or compensate end one by one
--   (outbox_workflow_finish). The settle takes each step's end (good or
--   not) from its caller, which just wrote it, instead of reading it back.
-- * Completions are read from the statement's transition table instead of
--   a row trigger that appended each to a transaction-local setting (the
--   setting grew by a copy per row). Deaths still use the row trigger and
--   the setting: a trigger with a column list (UPDATE OF dead_at, so that
--   claims do not fire it) cannot have a transition table.
-- * A step lists its dependencies by name (parent_names), and the edges
--   lose their index by child: a settle finds a parent's edges by the
--   primary key, and nothing else may look like a way to do it. With the
--   index by child, a planner whose statistics were taken while the edges
--   were few (a new install, or a quiet spell the retention emptied) chose
--   it for the settle's lookup by workflow and parent, and read every edge
--   of the workflow for each completion: a 10,000-way fan-in drained in 9
--   s instead of 0.4. Who asks for a step's parents (its handler, `workflows
--   show`, an operator's retry) reads them from the step.

ALTER TABLE outbox_workflow_steps ADD COLUMN parent_names text[] NOT NULL DEFAULT '{}';
UPDATE outbox_workflow_steps AS s
SET parent_names = e.names
FROM (SELECT workflow_id, child, array_agg(parent ORDER BY parent) AS names
      FROM outbox_workflow_edges
      GROUP BY workflow_id, child) AS e
WHERE s.workflow_id = e.workflow_id AND s.name = e.child;
DROP INDEX outbox_workflow_edges_child_idx;

-- outbox_workflow_settle now takes whether each step ended well
-- (completed or skipped) from its caller, which just wrote that state,
-- instead of reading the steps again.
DROP FUNCTION outbox_workflow_settle(bigint[], text[]);

CREATE FUNCTION outbox_workflow_settle(wfs bigint[], names text[], ended_well boolean[]) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    f_wf bigint[] := wfs;
    f_name text[] := names;
    f_well boolean[] := ended_well;
    closed_wf bigint[] := wfs;
    next_wf bigint[];
    next_name text[];
    next_well boolean[];
    ready_wf bigint[];
    ready_name text[];
    ended bigint;
    ending bigint[];
    counted_wf bigint[];
    counted_n integer[];
    woke integer;
    -- The sequence behind outbox_tasks.id, for the ids drawn below.
    task_ids regclass := pg_get_serial_sequence('outbox_tasks', 'id')::regclass;
BEGIN
    PERFORM 1 FROM outbox_workflows
    WHERE id = ANY (wfs)
    ORDER BY id
    FOR NO KEY UPDATE;
    WHILE cardinality(f_name) > 0 LOOP
        WITH frontier AS (
            SELECT f.wf, f.name, f.well AS good FROM unnest(f_wf, f_name, f_well) AS f(wf, name, well)
        ),
        -- A death is counted by marking its edges settled, so that the
        -- step's completion after an operator's retry (the only way a step
        -- reaches a final state twice) does not count again. A completion
        -- is final: its edges are read, not written.
        marked AS (
            UPDATE outbox_workflow_edges AS e
            SET settled = true
            FROM frontier
            WHERE NOT frontier.good
              AND e.workflow_id = frontier.wf AND e.parent = frontier.name AND NOT e.settled
            RETURNING e.workflow_id, e.child, false AS good
        ),
        counted AS (
            SELECT e.workflow_id, e.child, true AS good
            FROM frontier
            JOIN outbox_workflow_edges AS e ON e.workflow_id = frontier.wf AND e.parent = frontier.name
            WHERE frontier.good AND NOT e.settled
            UNION ALL
            SELECT workflow_id, child, good FROM marked
        ),
        -- n: the parents counted now; bad: those of them that died or were
        -- cancelled. Every counted parent leaves the child's count: a child
        -- that runs anyway waits for the rest, and one a dead parent
        -- cancels or skips is final (its count is not read again; an
        -- operator's retry recounts it).
        hits AS (
            SELECT workflow_id, child,
                   count(*) AS n,
                   count(*) FILTER (WHERE NOT good) AS bad
            FROM counted
            GROUP BY workflow_id, child
        ),
        -- A child waiting on nothing more and without an ordering key is
        -- released in the same write: its task's id is drawn here and the
        -- task inserted with it below. Keyed children are released by
        -- outbox_workflow_release_steps, which inserts in key order.
        changed AS (
            UPDATE outbox_workflow_steps AS s
            SET waiting_on = s.waiting_on - h.n,
                state = CASE WHEN h.bad > 0 AND s.on_parent_dead = 'cancel' THEN 'cancelled'
                             WHEN h.bad > 0 AND s.on_parent_dead = 'skip' THEN 'skipped'
                             WHEN s.ordering_key IS NULL AND s.waiting_on = h.n THEN 'released'
                             ELSE s.state END,
                task_id = CASE WHEN (h.bad = 0 OR s.on_parent_dead = 'run')
                                    AND s.ordering_key IS NULL AND s.waiting_on = h.n
                               THEN nextval(task_ids) END,
                finished_at = CASE WHEN h.bad > 0 AND s.on_parent_dead <> 'run'
                                   THEN clock_timestamp() END
            FROM hits AS h
            WHERE s.workflow_id = h.workflow_id AND s.name = h.child AND s.state = 'waiting'
            RETURNING s.*
        ),
        inserted AS (
            INSERT INTO outbox_tasks (id, task_type, queue, payload, priority, max_attempts,
                                      execute_at, skip_dead, workflow_id, workflow_step)
            OVERRIDING SYSTEM VALUE
            SELECT task_id, task_type, queue, payload, priority, max_attempts,
                   coalesce(run_at, now() + coalesce(delay_us, 0) * interval '1 microsecond'),
                   skip_dead, workflow_id, name
            FROM changed
            WHERE state = 'released'
            RETURNING queue, execute_at
        ),
        woken AS (
            SELECT pg_notify('outbox_tasks', q)
            FROM (SELECT DISTINCT queue AS q FROM inserted WHERE execute_at <= now()) AS due
        )
        SELECT coalesce(array_agg(workflow_id) FILTER (WHERE state IN ('cancelled', 'skipped')), '{}'),
               coalesce(array_agg(name) FILTER (WHERE state IN ('cancelled', 'skipped')), '{}'),
               coalesce(array_agg(state = 'skipped') FILTER (WHERE state IN ('cancelled', 'skipped')), '{}'),
               coalesce(array_agg(workflow_id) FILTER (WHERE state = 'waiting' AND waiting_on = 0), '{}'),
               coalesce(array_agg(name) FILTER (WHERE state = 'waiting' AND waiting_on = 0), '{}'),
               (SELECT count(*) FROM woken)
        INTO next_wf, next_name, next_well, ready_wf, ready_name, woke
        FROM changed;
        IF cardinality(ready_name) > 0 THEN
            PERFORM outbox_workflow_release_steps(ready_wf, ready_name);
        END IF;
        closed_wf := closed_wf || next_wf;
        f_wf := next_wf;
        f_name := next_name;
        f_well := next_well;
    END LOOP;
    -- Each workflow's open steps counted down; those with none left end:
    -- the usual end (running, no step dead or cancelled) for all of them
    -- at once, the others one by one (they fail or compensate). Rows are
    -- found by `id = ANY`, not by a join, which a planner that thinks the
    -- table empty could run by walking all of it for each workflow.
    SELECT array_agg(wf ORDER BY wf), array_agg(n ORDER BY wf)
    INTO counted_wf, counted_n
    FROM (SELECT wf, count(*)::integer AS n FROM unnest(closed_wf) AS wf GROUP BY wf) AS c;
    WITH written AS (
        UPDATE outbox_workflows AS w
        SET open_steps = w.open_steps - counted_n[array_position(counted_wf, w.id)],
            updated_at = now()
        WHERE w.id = ANY (counted_wf)
        RETURNING w.id, w.open_steps, w.finished_at
    )
    SELECT coalesce(array_agg(id) FILTER (WHERE open_steps = 0 AND finished_at IS NULL), '{}')
    INTO ending
    FROM written;
    IF cardinality(ending) = 0 THEN
        RETURN;
    END IF;
    WITH completed AS (
        UPDATE outbox_workflows AS w
        SET state = 'completed', finished_at = clock_timestamp()
        WHERE w.id = ANY (ending) AND w.state = 'running'
          AND NOT EXISTS (SELECT 1 FROM outbox_workflow_steps AS s
                          WHERE s.workflow_id = w.id AND s.state IN ('dead', 'cancelled'))
        RETURNING w.id
    )
    SELECT coalesce(array_agg(e ORDER BY e), '{}') INTO ending
    FROM unnest(ending) AS e
    WHERE e NOT IN (SELECT id FROM completed);
    FOREACH ended IN ARRAY ending LOOP
        PERFORM outbox_workflow_finish(ended);
    END LOOP;
END
$$;

-- Passes each closed step's end on to the settle.
CREATE OR REPLACE FUNCTION outbox_workflow_settle_notes(notes text) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    wfs bigint[];
    names text[];
    ended_well boolean[];
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
        RETURNING s.workflow_id, s.name, s.state = 'completed' AS ok
    )
    SELECT coalesce(array_agg(workflow_id), '{}'), coalesce(array_agg(name), '{}'),
           coalesce(array_agg(ok), '{}')
    INTO wfs, names, ended_well
    FROM closed;
    IF cardinality(names) > 0 THEN
        PERFORM outbox_workflow_settle(wfs, names, ended_well);
    END IF;
END
$$;

-- The statement's completions (workflow tasks that left outbox_tasks while
-- running: the outcome moved them to the history), with any deaths the
-- same statement noted, settled at once. A plain batch scans its deleted
-- rows and returns.
CREATE FUNCTION outbox_workflow_flush_completed() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    notes text;
BEGIN
    SELECT coalesce(current_setting('outbox.workflow_notes', true), '')
           || coalesce(string_agg(workflow_id || '/' || id || '/c/' || workflow_step || ';', ''), '')
    INTO notes
    FROM gone
    WHERE workflow_id IS NOT NULL AND state = 'processing';
    IF notes = '' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('outbox.workflow_notes', '', true);
    PERFORM outbox_workflow_settle_notes(notes);
    RETURN NULL;
END
$$;

-- Deaths only, now that completions come from the transition table: an
-- operator's retry (dead_at cleared) revives the step at once; a death
-- (dead_at set) is noted for the statement trigger.
CREATE OR REPLACE FUNCTION outbox_workflow_note() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.dead_at IS NULL THEN
        PERFORM outbox_workflow_revive(NEW.workflow_id, NEW.workflow_step, NEW.id);
        RETURN NULL;
    END IF;
    PERFORM set_config('outbox.workflow_notes',
                       coalesce(current_setting('outbox.workflow_notes', true), '')
                       || OLD.workflow_id || '/' || OLD.id || '/d/' || OLD.workflow_step || ';',
                       true);
    RETURN NULL;
END
$$;

DROP TRIGGER outbox_workflow_complete ON outbox_tasks;
DROP TRIGGER outbox_workflow_flush_deleted ON outbox_tasks;
CREATE TRIGGER outbox_workflow_flush_deleted
    AFTER DELETE ON outbox_tasks
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION outbox_workflow_flush_completed();

CREATE OR REPLACE FUNCTION outbox_workflow_submit(
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
                                       on_parent_dead, compensation, parents, waiting_on,
                                       parent_names)
    SELECT wf, s.name, s.seq::integer, s.task_type, s.queue, s.payload::jsonb, s.priority,
           s.max_attempts, s.run_at, s.delay_us, s.ordering_key, s.skip_dead,
           s.on_parent_dead, s.compensation::jsonb, coalesce(d.n, 0), coalesce(d.n, 0),
           coalesce(d.names, '{}')
    FROM unnest(names, task_types, queues, payloads, priorities, max_attempts, run_ats,
                delays_us, ordering_keys, skip_deads, on_parent_deads, compensations)
         WITH ORDINALITY
         AS s(name, task_type, queue, payload, priority, max_attempts, run_at, delay_us,
              ordering_key, skip_dead, on_parent_dead, compensation, seq)
    LEFT JOIN (SELECT c AS child, count(*)::integer AS n, array_agg(p ORDER BY p) AS names
               FROM unnest(edge_parents, edge_children) AS e(p, c) GROUP BY c) AS d
           ON d.child = s.name;
    INSERT INTO outbox_workflow_edges (workflow_id, parent, child)
    SELECT wf, p, c FROM unnest(edge_parents, edge_children) AS e(p, c);
    SELECT coalesce(array_agg(name), '{}') INTO roots
    FROM outbox_workflow_steps
    WHERE workflow_id = wf AND waiting_on = 0;
    PERFORM outbox_workflow_release(wf, roots);
    RETURN wf;
END
$$;

CREATE OR REPLACE FUNCTION outbox_workflow_finish(wf bigint) RETURNS void
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
               row_number() OVER (ORDER BY s.finished_at DESC, s.seq DESC) AS n,
               lag(s.name) OVER (ORDER BY s.finished_at DESC, s.seq DESC) AS undone_before
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
                                           waiting_on, parent_names)
        SELECT wf, 'undo:' || done.name, base.seq + done.n::integer,
               done.compensation->>'task_type', done.compensation->>'queue',
               done.compensation->'payload', (done.compensation->>'priority')::smallint,
               (done.compensation->>'max_attempts')::integer, done.name,
               least(done.n - 1, 1), least(done.n - 1, 1),
               CASE WHEN done.undone_before IS NULL THEN '{}'
                    ELSE ARRAY['undo:' || done.undone_before] END
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

CREATE OR REPLACE FUNCTION outbox_workflow_revive(wf bigint, step text, task bigint) RETURNS void
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
