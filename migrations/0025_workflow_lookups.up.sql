-- outbox: the workflow functions find their rows one primary-key probe at
-- a time, whatever the planner believes of the tables' sizes (issue 24).
--
-- The settle, the release of steps and the close of completed steps each
-- joined a list they were given (a batch's completions, a frontier, the
-- steps to release) with outbox_workflow_steps or outbox_workflow_edges.
-- When autovacuum had analyzed those tables while they were empty (the
-- retention removed every finished workflow, a quiet spell, a new install
-- after its first clean-up), the planner took them for one row and ran
-- each join with the table outside, read whole, and the list inside, read
-- again for every row: quadratic. A workflow of 10,000 parts took 45-65 s
-- to submit and 40-56 s to drain, against 0.4 and 0.5 s, until the next
-- analyze (`bench --fan-in 10000` after an ANALYZE of the empty tables).
--
-- Now every such lookup is a LATERAL subquery fenced with OFFSET 0, which
-- the planner can neither flatten into a join nor run other than once per
-- row of the list, by the primary key; and the rows found are written by
-- their ctid (a TID scan: no join to choose). A row's own values for the
-- write (a child's count of parents, whether a dead parent is among them,
-- a step's task id, a closed step's end) come from jsonb objects keyed by
-- its ctid or its name, built once per statement. (What works on one
-- workflow at a time, its end, a revive, a cancel, looks up by the
-- workflow's id, a prefix of the primary key, and is left as it was.)
--
-- A write by ctid passes over a row that changed since it was found, so
-- each is made where the rows cannot change underneath: the settle and
-- the release hold the workflows' rows, as every other writer of waiting
-- steps and edges does (a cancel, a revive); a released step with a given
-- task id is closed only by that task's outcome (which holds the task) or
-- by the sweep (the task gone). Each statement checks that it wrote every
-- row it found, and fails loudly otherwise rather than leave a workflow
-- waiting.

CREATE OR REPLACE FUNCTION outbox_workflow_release_steps(wfs bigint[], names text[]) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    released integer;
    tasks integer;
BEGIN
    IF cardinality(names) = 0 THEN
        RETURN 0;
    END IF;
    WITH wanted AS (
        SELECT DISTINCT w.wf, w.name FROM unnest(wfs, names) AS w(wf, name)
    ),
    ready AS MATERIALIZED (
        SELECT s.*
        FROM wanted
        CROSS JOIN LATERAL (
            SELECT s.ctid AS row_id, s.workflow_id, s.name, s.seq, s.task_type, s.queue,
                   s.payload, s.priority, s.max_attempts, s.run_at, s.delay_us,
                   s.ordering_key, s.skip_dead
            FROM outbox_workflow_steps AS s
            WHERE s.workflow_id = wanted.wf AND s.name = wanted.name
              AND s.state = 'waiting' AND s.waiting_on = 0
            OFFSET 0) AS s
    ),
    inserted AS (
        -- In key order, as a batch submit inserts, so that two releases
        -- cannot deadlock on keys; ids are drawn in that order too.
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
        SET state = 'released',
            task_id = ((SELECT jsonb_object_agg(i.workflow_id || '/' || i.workflow_step, i.id)
                        FROM inserted AS i)
                       ->> (s.workflow_id || '/' || s.name))::bigint
        WHERE s.ctid = ANY ((SELECT array_agg(ready.row_id) FROM ready)::tid[])
        RETURNING s.name
    ),
    woken AS (
        SELECT pg_notify('outbox_tasks', q)
        FROM (SELECT DISTINCT queue AS q FROM inserted WHERE execute_at <= now()) AS due
    )
    SELECT count(*), (SELECT count(*) FROM inserted) INTO released, tasks
    FROM marked
    WHERE (SELECT count(*) FROM woken) >= 0;
    -- The caller holds the workflows' rows: every step found is written.
    IF released <> tasks THEN
        RAISE EXCEPTION 'outbox: % workflow steps released, % tasks inserted', released, tasks;
    END IF;
    RETURN released;
END
$$;

-- Closes the noted steps (steps[i] of workflow wfs[i], released for task
-- tasks[i]; kinds[i] 'c' completed, otherwise dead) and settles them. A
-- note whose step is no longer released by that task changes nothing.
-- The close of migration 21's outbox_workflow_settle_notes and migration
-- 22's outbox_workflow_flush_completed, now shared by both.
CREATE FUNCTION outbox_workflow_close(wfs bigint[], tasks bigint[], kinds text[], steps text[])
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    found_rows tid[];
    dead_rows jsonb;
    closed_wf bigint[];
    closed_name text[];
    ended_well boolean[];
BEGIN
    -- A step noted twice is one row to write.
    SELECT coalesce(array_agg(DISTINCT s.row_id), '{}'),
           coalesce(jsonb_object_agg(s.row_id::text, true) FILTER (WHERE n.kind <> 'c'), '{}')
    INTO found_rows, dead_rows
    FROM unnest(wfs, tasks, kinds, steps) AS n(wf, task, kind, step)
    CROSS JOIN LATERAL (
        SELECT s.ctid AS row_id
        FROM outbox_workflow_steps AS s
        WHERE s.workflow_id = n.wf AND s.name = n.step
          AND s.task_id = n.task AND s.state = 'released'
        OFFSET 0) AS s;
    IF cardinality(found_rows) = 0 THEN
        RETURN;
    END IF;
    -- Nothing else writes a released step with this task id (its task's
    -- outcome is the caller's statement, or the task is gone), so every
    -- row found is there to be written.
    WITH closed AS (
        UPDATE outbox_workflow_steps AS s
        SET state = CASE WHEN dead_rows ? s.ctid::text THEN 'dead' ELSE 'completed' END,
            finished_at = clock_timestamp()
        WHERE s.ctid = ANY (found_rows) AND s.state = 'released'
        RETURNING s.workflow_id, s.name, s.state = 'completed' AS ok
    )
    SELECT coalesce(array_agg(workflow_id), '{}'), coalesce(array_agg(name), '{}'),
           coalesce(array_agg(ok), '{}')
    INTO closed_wf, closed_name, ended_well
    FROM closed;
    IF cardinality(closed_name) <> cardinality(found_rows) THEN
        RAISE EXCEPTION 'outbox: % workflow steps found to close, % closed',
            cardinality(found_rows), cardinality(closed_name);
    END IF;
    PERFORM outbox_workflow_settle(closed_wf, closed_name, ended_well);
END
$$;

-- The statement's completions, with any deaths it noted (migration 22).
CREATE OR REPLACE FUNCTION outbox_workflow_flush_completed() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    deaths text := coalesce(current_setting('outbox.workflow_notes', true), '');
    wfs bigint[];
    tasks bigint[];
    kinds text[];
    steps text[];
BEGIN
    IF deaths = '' AND NOT EXISTS (SELECT 1 FROM gone
                                   WHERE workflow_id IS NOT NULL AND state = 'processing') THEN
        RETURN NULL;
    END IF;
    IF deaths <> '' THEN
        PERFORM set_config('outbox.workflow_notes', '', true);
    END IF;
    WITH noted AS (
        SELECT g.workflow_id AS wf, g.id AS task, 'c' AS kind, g.workflow_step AS step
        FROM gone AS g
        WHERE g.workflow_id IS NOT NULL AND g.state = 'processing'
        UNION ALL
        SELECT split_part(n, '/', 1)::bigint, split_part(n, '/', 2)::bigint, split_part(n, '/', 3),
               substr(n, length(split_part(n, '/', 1)) + length(split_part(n, '/', 2)) + 5)
        FROM unnest(string_to_array(rtrim(deaths, ';'), ';')) AS n
    )
    SELECT array_agg(wf), array_agg(task), array_agg(kind), array_agg(step)
    INTO wfs, tasks, kinds, steps
    FROM noted;
    IF wfs IS NOT NULL THEN
        PERFORM outbox_workflow_close(wfs, tasks, kinds, steps);
    END IF;
    RETURN NULL;
END
$$;

-- Deaths noted by the row trigger, and the sweep's finds (migration 21).
CREATE OR REPLACE FUNCTION outbox_workflow_settle_notes(notes text) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    wfs bigint[];
    tasks bigint[];
    kinds text[];
    steps text[];
BEGIN
    SELECT array_agg(split_part(n, '/', 1)::bigint), array_agg(split_part(n, '/', 2)::bigint),
           array_agg(split_part(n, '/', 3)),
           array_agg(substr(n, length(split_part(n, '/', 1)) + length(split_part(n, '/', 2)) + 5))
    INTO wfs, tasks, kinds, steps
    FROM unnest(string_to_array(rtrim(notes, ';'), ';')) AS n;
    IF wfs IS NOT NULL THEN
        PERFORM outbox_workflow_close(wfs, tasks, kinds, steps);
    END IF;
END
$$;

-- The settle of migration 21, its lookups by primary key and its writes
-- by ctid.
CREATE OR REPLACE FUNCTION outbox_workflow_settle(wfs bigint[], names text[], ended_well boolean[]) RETURNS void
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
    dead_edges tid[];
    children tid[];
    bad_children jsonb;
    -- Whether bad_children has any: most settles have none, and skip the
    -- lookups.
    any_bad boolean;
    written bigint;
    counts jsonb;
    -- The sequence behind outbox_tasks.id, for the ids drawn below.
    task_ids regclass := pg_get_serial_sequence('outbox_tasks', 'id')::regclass;
BEGIN
    PERFORM 1 FROM outbox_workflows
    WHERE id = ANY (wfs)
    ORDER BY id
    FOR NO KEY UPDATE;
    WHILE cardinality(f_name) > 0 LOOP
        -- The frontier's edges not yet counted, each step's by the primary
        -- key, then the children they count, each by its own: the rows to
        -- write, by ctid; those a parent that died or was cancelled counts
        -- in (bad); and how many parents each counts now, by ctid.
        WITH edge AS MATERIALIZED (
            SELECT f.wf, e.child, f.well AS good, e.row_id
            FROM unnest(f_wf, f_name, f_well) AS f(wf, name, well)
            CROSS JOIN LATERAL (
                SELECT e.ctid AS row_id, e.child
                FROM outbox_workflow_edges AS e
                WHERE e.workflow_id = f.wf AND e.parent = f.name AND NOT e.settled
                OFFSET 0) AS e
        ),
        hits AS (
            SELECT edge.wf, edge.child, count(*) AS n, count(*) FILTER (WHERE NOT edge.good) AS bad
            FROM edge
            GROUP BY edge.wf, edge.child
        ),
        kids AS (
            SELECT s.row_id, hits.n, hits.bad
            FROM hits
            CROSS JOIN LATERAL (
                SELECT s.ctid AS row_id
                FROM outbox_workflow_steps AS s
                WHERE s.workflow_id = hits.wf AND s.name = hits.child AND s.state = 'waiting'
                OFFSET 0) AS s
        )
        SELECT (SELECT coalesce(array_agg(edge.row_id), '{}') FROM edge WHERE NOT edge.good),
               coalesce(array_agg(kids.row_id), '{}'),
               coalesce(jsonb_object_agg(kids.row_id::text, true) FILTER (WHERE kids.bad > 0), '{}'),
               coalesce(jsonb_object_agg(kids.row_id::text, kids.n), '{}')
        INTO dead_edges, children, bad_children, counts
        FROM kids;
        any_bad := bad_children <> '{}'::jsonb;
        -- A death is counted by marking its edges settled, so that the
        -- step's completion after an operator's retry (the only way a step
        -- reaches a final state twice) does not count again. A completion
        -- is final: its edges are read, not written.
        IF cardinality(dead_edges) > 0 THEN
            UPDATE outbox_workflow_edges SET settled = true WHERE ctid = ANY (dead_edges);
        END IF;
        -- Every counted parent leaves the child's count: a child that runs
        -- anyway waits for the rest, and one a dead parent cancels or
        -- skips is final (its count is not read again; an operator's retry
        -- recounts it). A child waiting on nothing more and without an
        -- ordering key is released in the same write: its task's id is
        -- drawn here and the task inserted with it below. Keyed children
        -- are released by outbox_workflow_release_steps, which inserts in
        -- key order.
        WITH changed AS (
            UPDATE outbox_workflow_steps AS s
            SET waiting_on = s.waiting_on - (counts ->> s.ctid::text)::integer,
                state = CASE WHEN any_bad AND bad_children ? s.ctid::text
                                  AND s.on_parent_dead = 'cancel' THEN 'cancelled'
                             WHEN any_bad AND bad_children ? s.ctid::text
                                  AND s.on_parent_dead = 'skip' THEN 'skipped'
                             WHEN s.ordering_key IS NULL
                                  AND s.waiting_on = (counts ->> s.ctid::text)::integer
                             THEN 'released'
                             ELSE s.state END,
                task_id = CASE WHEN (NOT (any_bad AND bad_children ? s.ctid::text)
                                     OR s.on_parent_dead = 'run')
                                    AND s.ordering_key IS NULL
                                    AND s.waiting_on = (counts ->> s.ctid::text)::integer
                               THEN nextval(task_ids) END,
                finished_at = CASE WHEN any_bad AND bad_children ? s.ctid::text
                                        AND s.on_parent_dead <> 'run'
                                   THEN clock_timestamp() END
            WHERE s.ctid = ANY (children) AND s.state = 'waiting'
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
               (SELECT count(*) FROM woken), count(*)
        INTO next_wf, next_name, next_well, ready_wf, ready_name, woke, written
        FROM changed;
        -- The workflows' rows are held: every child found is there to be
        -- written.
        IF written <> cardinality(children) THEN
            RAISE EXCEPTION 'outbox: % workflow steps found to count down, % written',
                cardinality(children), written;
        END IF;
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
