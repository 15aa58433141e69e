-- Back to migration 21: the claim without workflow_id (as in migration
-- 18), and completions passed to the settle as text.

DROP FUNCTION outbox_claim_tasks(text, bigint, text, timestamptz, smallint, timestamptz, bigint,
                                 timestamptz, bigint);
CREATE FUNCTION outbox_claim_tasks(q text, n bigint, token text, clock timestamptz,
                                   floor_priority smallint, floor_execute_at timestamptz,
                                   floor_id bigint, front_execute_at timestamptz,
                                   front_id bigint)
RETURNS TABLE (id bigint, task_type text, queue text, payload text, retry_count integer,
               max_attempts integer, claims integer, ordered boolean, key_seq bigint,
               created_at timestamptz, trace_context text, priority smallint,
               execute_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    -- An operator's pause or limit waits for this claim; one that
    -- committed first is seen.
    PERFORM 1 FROM outbox_queues AS o
    WHERE o.name = q
      AND o.paused_at IS NULL AND o.global_concurrency IS NULL AND o.rate_per_second IS NULL
    FOR SHARE;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM outbox_queues AS o WHERE o.name = q) THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH next AS (
        (SELECT r.id FROM (
         SELECT t.id
         FROM outbox_tasks AS t
         WHERE t.queue = q
           AND t.state IN ('pending', 'failed') AND t.dead_at IS NULL AND NOT t.blocked
           AND t.execute_at <= coalesce(clock, now())
           AND t.priority < floor_priority
         ORDER BY t.priority, t.execute_at, t.id
         LIMIT n
         FOR UPDATE SKIP LOCKED) AS r)
        UNION ALL
        (SELECT r.id FROM (
         SELECT t.id
         FROM outbox_tasks AS t
         WHERE t.queue = q
           AND t.state IN ('pending', 'failed') AND t.dead_at IS NULL AND NOT t.blocked
           AND t.execute_at <= coalesce(clock, now())
           AND (t.priority, t.execute_at, t.id) > (floor_priority, floor_execute_at, floor_id)
         ORDER BY t.priority, t.execute_at, t.id
         LIMIT n
         FOR UPDATE SKIP LOCKED) AS r)
        UNION ALL
        (SELECT r.id FROM (
         SELECT t.id
         FROM outbox_tasks AS t
         WHERE t.queue = q
           AND t.state IN ('pending', 'failed') AND t.dead_at IS NULL AND NOT t.blocked
           AND t.execute_at <= coalesce(clock, now())
           AND t.priority = floor_priority
           AND (t.execute_at, t.id) <= (floor_execute_at, floor_id)
           AND (t.execute_at, t.id) >= (coalesce(front_execute_at, '-infinity'),
                                        coalesce(front_id, 0))
         ORDER BY t.priority, t.execute_at, t.id
         LIMIT n
         FOR UPDATE SKIP LOCKED) AS r)
        LIMIT n
    )
    UPDATE outbox_tasks AS t
    SET state = 'processing',
        claims = t.claims + 1,
        claimed_by = token,
        heartbeat_at = coalesce(clock, now()),
        attempted_at = coalesce(clock, clock_timestamp()),
        updated_at = coalesce(clock, now())
    FROM next
    WHERE t.id = next.id
    RETURNING t.id, t.task_type, t.queue, t.payload::text, t.retry_count, t.max_attempts,
              t.claims, t.ordering_key IS NOT NULL, t.key_seq, t.created_at, t.trace_context,
              t.priority, t.execute_at;
END
$$;

CREATE OR REPLACE FUNCTION outbox_workflow_flush_completed() RETURNS trigger
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
