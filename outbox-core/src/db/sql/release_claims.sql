-- Puts tasks held under the given claim tokens back to PENDING, claimable
-- at once, without counting an attempt: tasks whose handlers were stopped
-- at shutdown, and the tasks of a claim whose answer never arrived (the
-- claim may have committed although the connection broke first).
-- $1 claim tokens text[]. With $2 (task ids, bigint[], parallel to $1),
-- only those (id, token) pairs: claimed-ahead tasks whose handlers never
-- started, given back at shutdown while other tasks of their claims still
-- run. Reads PROCESSING rows (outbox_tasks_processing_idx), and the tasks
-- of a run held in place (migration 43) by id, or with all of a claim's
-- tasks by their run's last task, which is PROCESSING under the same
-- claim and key.
WITH targets AS (
    SELECT t.id FROM outbox_tasks AS t
    WHERE t.state = 'processing'
      AND t.claimed_by = ANY($1::text[])
      AND ($2::bigint[] IS NULL
           OR (t.id, t.claimed_by) IN (SELECT * FROM unnest($2::bigint[], $1::text[])))
    UNION ALL
    SELECT w.id
    FROM (SELECT DISTINCT r.queue, r.ordering_key, r.claimed_by FROM outbox_tasks AS r
          WHERE $2::bigint[] IS NULL AND r.state = 'processing' AND r.blocked
            AND r.claimed_by = ANY($1::text[])) AS k
    JOIN outbox_tasks AS w
      ON w.queue = k.queue AND w.ordering_key = k.ordering_key AND w.blocked
     AND w.state = 'pending' AND w.claimed_by = k.claimed_by
    UNION ALL
    SELECT w.id FROM outbox_tasks AS w
    WHERE $2::bigint[] IS NOT NULL AND w.id = ANY($2::bigint[]) AND w.state = 'pending'
      AND (w.id, w.claimed_by) IN (SELECT * FROM unnest($2::bigint[], $1::text[]))
),
-- A run's tasks held in place without a write (migration 56) wait in
-- their key's line as they did; those an operator asked to cancel are
-- dead, in the runs whose last task goes back here.
unwritten AS (
    SELECT w.id
    FROM outbox_tasks AS r
    JOIN outbox_tasks AS w
      ON w.queue = r.queue AND w.ordering_key = r.ordering_key AND w.blocked
     AND w.key_seq >= r.run_from AND w.key_seq < r.key_seq
     AND w.state = 'pending' AND w.claimed_by IS NULL
    WHERE r.id = ANY (ARRAY(SELECT targets.id FROM targets)) AND r.blocked
      AND (r.state = 'processing') IS TRUE AND r.claimed_by = ANY($1::text[])
),
-- Every task taken here locked first, in id order (as a cancel locks its
-- tasks), waiting (an operator's cancel is short): a cancel committed
-- meanwhile is then seen, not lost.
locked AS (
    SELECT t.id, t.state, t.blocked, t.claimed_by, t.cancel_requested_at
    FROM outbox_tasks AS t
    WHERE t.id = ANY (ARRAY(SELECT targets.id FROM targets UNION SELECT u.id FROM unwritten AS u))
    ORDER BY t.id
    FOR UPDATE
),
cancelled_held AS (
    SELECT l.id FROM locked AS l
    WHERE l.id IN (SELECT u.id FROM unwritten AS u)
      AND l.claimed_by IS NULL AND l.state = 'pending' AND l.blocked
      AND l.cancel_requested_at IS NOT NULL
),
done AS (
    UPDATE outbox_tasks
    SET state = CASE WHEN cancel_requested_at IS NOT NULL THEN 'failed' ELSE 'pending' END::outbox_task_state,
        -- An operator asked to cancel it: dead, not released.
        dead_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,
        finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,
        last_error = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled by an operator'
                          ELSE last_error END,
        -- Dead, it leaves its key's line (a task of a run waits in it).
        blocked = blocked AND cancel_requested_at IS NULL,
        claimed_by = NULL,
        heartbeat_at = NULL,
        execute_at = least(execute_at, now()),
        updated_at = now()
    -- By primary key; the claim checked again once the row is locked.
    WHERE id = ANY (ARRAY(SELECT targets.id FROM targets UNION ALL
                          SELECT c.id FROM cancelled_held AS c))
      AND (claimed_by = ANY($1::text[])
           -- Cancelled while held without a write (as in release_run.sql).
           OR claimed_by IS NULL AND id IN (SELECT c.id FROM cancelled_held AS c))
    RETURNING id, queue, ordering_key, state, dead_at, skip_dead, blocked
),
handed AS (
    -- Tasks that let go of their ordering key hand it on (after every row
    -- above is written: the aggregate reads them all first).
    SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key)) AS n
    FROM done
    WHERE ordering_key IS NOT NULL
      AND (NOT (state <> 'completed' AND (dead_at IS NULL OR NOT skip_dead))
           -- A task of a run (migration 28): its key goes to the first
           -- task left in its line, if nothing holds it.
           OR blocked)
    HAVING count(*) > 0
)
SELECT id FROM done WHERE (SELECT count(*) FROM handed) >= 0
