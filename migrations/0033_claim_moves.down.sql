-- Back to migration 32: the claims' new signatures wrap the bodies of
-- migrations 28 and 27 (migration 31), and outbox_take_intake calls the
-- mover even with nothing to move.

CREATE OR REPLACE FUNCTION outbox_claim_tasks(q text, n bigint, token text, clock timestamptz,
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

CREATE OR REPLACE FUNCTION outbox_claim_limited(claim_queue text, wanted bigint, claim_token text,
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

CREATE OR REPLACE FUNCTION outbox_take_intake(wanted bigint, above bigint, own_queue text)
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
