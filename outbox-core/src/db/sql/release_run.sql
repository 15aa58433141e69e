-- Gives back the rest of a run (migration 28) whose task did not complete
-- here: the given (task id, claim token) pairs still held (PROCESSING, or
-- held in place: migration 43) go back to PENDING without counting an
-- attempt, still in their key's line, and each key goes to the first task
-- in its line if nothing holds it. Unlike release_claims.sql (shutdown),
-- the keys are taken as outcomes take them: a key whose row another
-- transaction holds for more than 50 ms (an application's open submit)
-- comes back as `deferred_key`, owed a hand-over
-- (worker/deferred_keys.rs). The keys of tasks that are no longer this
-- worker's are let go of too (belt and braces: recovery takes a run back
-- only whole, so no outcome before them kept a key for a task recovery
-- had taken). A task held in place without a write (migration 56) is
-- not written here: it waits in its key's line as it did, unless an
-- operator asked to cancel it, and then it is dead, as one held under the
-- claim is. $1 task ids, $2 claim tokens.
--
-- Every task given is locked first, in id order (as a cancel locks its
-- tasks), waiting (an operator's cancel is short): a cancel committed
-- meanwhile is then seen, not lost.
WITH locked AS (
    SELECT t.id, t.queue, t.ordering_key, t.key_seq, t.state, t.blocked, t.claimed_by,
           t.cancel_requested_at
    FROM outbox_tasks AS t
    WHERE t.id = ANY ($1::bigint[])
    ORDER BY t.id
    FOR UPDATE
),
cancelled_held AS (
    SELECT l.id
    FROM locked AS l
    JOIN unnest($1::bigint[], $2::text[]) AS g(id, token) ON g.id = l.id
    WHERE l.claimed_by IS NULL AND l.state = 'pending' AND l.blocked
      AND l.cancel_requested_at IS NOT NULL
      AND outbox_run_claim(l.queue, l.ordering_key, l.key_seq) = g.token
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
    WHERE id = ANY ($1::bigint[] || ARRAY(SELECT c.id FROM cancelled_held AS c))
      -- IS TRUE: by primary key, never the running tasks' index read
      -- whole (heartbeat.sql says why).
      -- (PROCESSING, or held in place: migration 43).
      AND (state = 'processing' OR (state = 'pending' AND blocked)) IS TRUE
      AND ((id, claimed_by) IN (SELECT * FROM unnest($1::bigint[], $2::text[]))
           -- Cancelled while held without a write (above). Not tested on
           -- cancel_requested_at here: the cancel may have committed after
           -- this statement's snapshot, and only a row that passes these
           -- tests is read again, at its latest, once locked.
           OR claimed_by IS NULL AND id IN (SELECT c.id FROM cancelled_held AS c))
    RETURNING id, queue, ordering_key
),
keys AS (
    SELECT t.queue, t.ordering_key FROM outbox_tasks AS t
    WHERE t.id = ANY ($1::bigint[]) AND t.ordering_key IS NOT NULL
),
handed AS (
    SELECT l.queue, l.deferred_key
    FROM (SELECT array_agg(k.queue) AS q, array_agg(k.ordering_key) AS k
          FROM (SELECT queue, ordering_key FROM done WHERE ordering_key IS NOT NULL
                UNION
                SELECT queue, ordering_key FROM keys) AS k
          HAVING count(*) > 0) AS released,
         LATERAL outbox_keys_let_go(released.q, released.k, interval '50 milliseconds',
                                    '{}'::text[], '{}'::int[], NULL::text,
                                    NULL::timestamptz) AS l
)
SELECT id, NULL::text AS queue, NULL::text AS deferred_key FROM done
UNION ALL
SELECT NULL, queue, deferred_key FROM handed WHERE deferred_key IS NOT NULL
