-- The intake (issue 23, item 2): a narrow table that a single submit of a
-- task due now, with no ordering key, appends to inside the caller's
-- transaction, instead of a row of outbox_tasks. A task row has 27
-- columns, nine indexes, four checks and an insert trigger, and costs the
-- caller's transaction about three times what a plain row of the same
-- fields costs; the intake row has the fields a submit sets, one index and
-- no check.
-- Claims move it into outbox_tasks (outbox_take_intake) in their own
-- transaction, before they read the claimable index, so the price is paid
-- by the worker, off the caller's commit path.
--
-- A task in the intake keeps its id (drawn from the task table's
-- sequence), its created_at and trace context; it becomes due at
-- created_at. Reads by id and lists see it through outbox_all_tasks as
-- pending. A cancel moves it first with outbox_take_intake_ids, waiting
-- for a claim that is moving it at that moment; a signal is recorded for
-- it where it is (send_signal.sql).
--
-- A submitter's database role needs INSERT on outbox_intake and USAGE on
-- outbox_tasks_id_seq (guide, section 3).
CREATE TABLE outbox_intake (
    id            bigint PRIMARY KEY DEFAULT nextval('outbox_tasks_id_seq'),
    task_type     text NOT NULL,
    queue         text NOT NULL,
    payload       jsonb NOT NULL,
    priority      smallint NOT NULL,
    max_attempts  integer NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    trace_context text DEFAULT nullif(current_setting('outbox.traceparent', true), '')
    -- No CHECK constraints: PostgreSQL sets up each check's expression for
    -- every insert statement, and two of them cost a single submit about
    -- 0.3x of a plain row (PERFORMANCE.md, "The intake"). The submit
    -- validates priority and max_attempts before it writes, and the move
    -- clamps them into the task table's ranges, so that no value of them
    -- written here by hand can stop the moves.
);

-- Every row is deleted within moments of its commit: vacuum after a few
-- hundred dead rows, unthrottled, and never truncate the table's end,
-- which takes a lock that every submit would queue behind.
ALTER TABLE outbox_intake SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false
);

-- Moves the tasks `ids` that are in the intake into outbox_tasks as
-- pending, waiting for a transaction moving one of them to end: once this
-- returns, a statement with a fresh snapshot finds each of them in
-- outbox_tasks. A cancel calls it (in a transaction of its own), and so
-- does every move (outbox_take_intake, with rows it has locked). Returns
-- the highest id it moved (null when none).
--
-- The queues of the moved tasks other than `own_queue` (a claimer's) are
-- notified at commit: their workers may have looked while this move held
-- the rows, found nothing, and gone to sleep until their next poll.
CREATE FUNCTION outbox_take_intake_ids(ids bigint[], own_queue text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    moved_to bigint;
    moved_queues text[];
BEGIN
WITH taken AS (
    DELETE FROM outbox_intake AS i
    WHERE i.id = ANY (ids)
    RETURNING i.*
),
moved AS (
    INSERT INTO outbox_tasks (id, task_type, queue, payload, priority, max_attempts,
                              execute_at, created_at, trace_context)
    OVERRIDING SYSTEM VALUE
    SELECT id, task_type, queue, payload, least(greatest(priority, 0), 9),
           greatest(max_attempts, 1), created_at, created_at, trace_context
    FROM taken
    RETURNING id, queue
)
SELECT max(moved.id), array_agg(DISTINCT moved.queue) INTO moved_to, moved_queues FROM moved;
PERFORM pg_notify('outbox_tasks', q)
FROM unnest(moved_queues) AS q
WHERE q IS DISTINCT FROM own_queue;
RETURN moved_to;
END
$$;

-- Moves up to `wanted` committed tasks of the intake with ids above
-- `above`, the lowest first, passing over rows another transaction is
-- moving (outbox_take_intake_ids does the rest). Returns the highest id
-- it moved (null when none). A claimer reads above the ids it moved a
-- moment ago (less a margin, and from 0 every second; see db/intake.rs),
-- so that a snapshot held open elsewhere, which keeps every deleted row's
-- index entry, does not make each claim walk all of them.
CREATE FUNCTION outbox_take_intake(wanted bigint, above bigint, own_queue text)
RETURNS bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
RETURN outbox_take_intake_ids(ARRAY(SELECT x.id FROM outbox_intake AS x
                                    WHERE x.id > above
                                    ORDER BY x.id LIMIT wanted
                                    FOR UPDATE SKIP LOCKED),
                              own_queue);
END
$$;

-- The claims of migration 28 (plain) and 27 (limited) keep their bodies
-- under new names. Under the old names and signatures, which workers of
-- the version before call, they move the intake first, from its first row
-- (so a rolling upgrade that migrates before it replaces the workers
-- leaves no task in the intake); the new overloads move it from
-- `intake_above` (none when null) and say how far they went.
ALTER FUNCTION outbox_claim_tasks(text, bigint, text, timestamptz, smallint, timestamptz, bigint,
                                  timestamptz, bigint, integer)
    RENAME TO outbox_claim_tasks_body;
ALTER FUNCTION outbox_claim_limited(text, bigint, text, timestamptz)
    RENAME TO outbox_claim_limited_body;

CREATE FUNCTION outbox_claim_tasks(q text, n bigint, token text, clock timestamptz,
                                   floor_priority smallint, floor_execute_at timestamptz,
                                   floor_id bigint, front_execute_at timestamptz,
                                   front_id bigint, run_length integer, intake_above bigint)
RETURNS TABLE (id bigint, task_type text, queue text, payload text, retry_count integer,
               max_attempts integer, claims integer, ordered boolean, key_seq bigint,
               created_at timestamptz, trace_context text, priority smallint,
               execute_at timestamptz, workflow_id bigint, follows boolean,
               ordering_key text, intake_to bigint)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    moved_to bigint;
BEGIN
    IF intake_above IS NOT NULL THEN
        moved_to := outbox_take_intake(1000, intake_above, q);
    END IF;
    RETURN QUERY
    SELECT c.*, moved_to
    FROM outbox_claim_tasks_body(q, n, token, clock, floor_priority, floor_execute_at,
                                 floor_id, front_execute_at, front_id, run_length) AS c;
    -- Nothing claimed, something moved: one row with a null id says how
    -- far.
    IF NOT FOUND AND moved_to IS NOT NULL THEN
        RETURN QUERY
        SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer,
               NULL::integer, NULL::boolean, NULL::bigint, NULL::timestamptz, NULL::text,
               NULL::smallint, NULL::timestamptz, NULL::bigint, NULL::boolean, NULL::text,
               moved_to;
    END IF;
END
$$;

CREATE FUNCTION outbox_claim_limited(claim_queue text, wanted bigint, claim_token text,
                                     at timestamptz, intake_above bigint)
RETURNS TABLE (id bigint, task_type text, queue text, payload text, retry_count integer,
               max_attempts integer, claims integer, ordered boolean, key_seq bigint,
               created_at timestamptz, trace_context text, workflow_id bigint,
               allowed bigint, intake_to bigint)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    moved_to bigint;
BEGIN
    IF intake_above IS NOT NULL THEN
        moved_to := outbox_take_intake(1000, intake_above, claim_queue);
    END IF;
    RETURN QUERY
    SELECT c.*, moved_to
    FROM outbox_claim_limited_body(claim_queue, wanted, claim_token, at) AS c;
    -- Paused (no row at all), something moved: one row with a null id and
    -- nothing allowed says how far.
    IF NOT FOUND AND moved_to IS NOT NULL THEN
        RETURN QUERY
        SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer,
               NULL::integer, NULL::boolean, NULL::bigint, NULL::timestamptz, NULL::text,
               NULL::bigint, 0::bigint, moved_to;
    END IF;
END
$$;

-- The old signatures, for workers of the version before: the new ones,
-- moving the intake from its first row.
CREATE FUNCTION outbox_claim_tasks(q text, n bigint, token text, clock timestamptz,
                                   floor_priority smallint, floor_execute_at timestamptz,
                                   floor_id bigint, front_execute_at timestamptz,
                                   front_id bigint, run_length integer)
RETURNS TABLE (id bigint, task_type text, queue text, payload text, retry_count integer,
               max_attempts integer, claims integer, ordered boolean, key_seq bigint,
               created_at timestamptz, trace_context text, priority smallint,
               execute_at timestamptz, workflow_id bigint, follows boolean,
               ordering_key text)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    -- The new signature's row that only says how far the move went (null
    -- id) is no claimed task.
    RETURN QUERY
    SELECT c.id, c.task_type, c.queue, c.payload, c.retry_count, c.max_attempts, c.claims,
           c.ordered, c.key_seq, c.created_at, c.trace_context, c.priority, c.execute_at,
           c.workflow_id, c.follows, c.ordering_key
    FROM outbox_claim_tasks(q, n, token, clock, floor_priority, floor_execute_at, floor_id,
                            front_execute_at, front_id, run_length, 0) AS c
    WHERE c.id IS NOT NULL;
END
$$;

CREATE FUNCTION outbox_claim_limited(claim_queue text, wanted bigint, claim_token text,
                                     at timestamptz)
RETURNS TABLE (id bigint, task_type text, queue text, payload text, retry_count integer,
               max_attempts integer, claims integer, ordered boolean, key_seq bigint,
               created_at timestamptz, trace_context text, workflow_id bigint,
               allowed bigint)
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    -- A paused queue's row that only says how far the move went (null id,
    -- nothing allowed) reads as the pause did: held back.
    RETURN QUERY
    SELECT c.id, c.task_type, c.queue, c.payload, c.retry_count, c.max_attempts, c.claims,
           c.ordered, c.key_seq, c.created_at, c.trace_context, c.workflow_id, c.allowed
    FROM outbox_claim_limited(claim_queue, wanted, claim_token, at, 0) AS c;
END
$$;

-- Every task, the intake's included (as pending, never claimed).
CREATE OR REPLACE VIEW outbox_all_tasks AS
SELECT id, task_type, queue, payload, state, priority, retry_count, max_attempts, claims,
       execute_at, created_at, updated_at, claimed_by, heartbeat_at, finished_at, dead_at,
       last_error, unique_key, unique_states, result, cancel_requested_at, ordering_key,
       key_seq, blocked, skip_dead, attempted_at
FROM outbox_tasks
UNION ALL
SELECT id, task_type, queue, payload, 'completed'::outbox_task_state, priority, retry_count,
       max_attempts, claims, execute_at, created_at, finished_at, NULL::text, NULL::timestamptz,
       finished_at, NULL::timestamptz, last_error, unique_key, NULL::smallint, result,
       NULL::timestamptz, ordering_key, key_seq, false, false, attempted_at
FROM outbox_task_history
UNION ALL
SELECT id, task_type, queue, payload, 'pending'::outbox_task_state, priority, 0, max_attempts,
       0, created_at, created_at, created_at, NULL::text, NULL::timestamptz, NULL::timestamptz,
       NULL::timestamptz, NULL::text, NULL::text, NULL::smallint, NULL::jsonb,
       NULL::timestamptz, NULL::text, NULL::bigint, false, false, NULL::timestamptz
FROM outbox_intake;
