-- Back to migration 24: the workflow functions' lookups as joins (the
-- settle and the close of notes of migration 21, the release of migration
-- 15, the close of completions of migration 22).

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

CREATE OR REPLACE FUNCTION outbox_workflow_release_steps(wfs bigint[], names text[]) RETURNS integer
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

CREATE OR REPLACE FUNCTION outbox_workflow_flush_completed() RETURNS trigger
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    deaths text := coalesce(current_setting('outbox.workflow_notes', true), '');
    wfs bigint[];
    names text[];
    ended_well boolean[];
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
    RETURN NULL;
END
$$;

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

DROP FUNCTION outbox_workflow_close(bigint[], bigint[], text[], text[]);
