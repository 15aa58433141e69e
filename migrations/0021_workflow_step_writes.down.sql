-- Back to migration 15's completion trigger, settle, and edges' index by child.
DROP TRIGGER outbox_workflow_flush_deleted ON outbox_tasks;
DROP FUNCTION outbox_workflow_flush_completed();
CREATE TRIGGER outbox_workflow_complete
    AFTER DELETE ON outbox_tasks
    FOR EACH ROW WHEN (OLD.workflow_id IS NOT NULL AND OLD.state = 'processing')
    EXECUTE FUNCTION outbox_workflow_note();
CREATE TRIGGER outbox_workflow_flush_deleted
    AFTER DELETE ON outbox_tasks
    FOR EACH STATEMENT
    EXECUTE FUNCTION outbox_workflow_flush();
DROP FUNCTION outbox_workflow_settle(bigint[], text[], boolean[]);
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

CREATE INDEX outbox_workflow_edges_child_idx ON outbox_workflow_edges (workflow_id, child);
ALTER TABLE outbox_workflow_steps DROP COLUMN parent_names;

CREATE OR REPLACE FUNCTION outbox_workflow_settle_notes(notes text) RETURNS void
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

CREATE OR REPLACE FUNCTION outbox_workflow_note() RETURNS trigger
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
