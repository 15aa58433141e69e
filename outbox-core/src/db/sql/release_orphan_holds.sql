-- Tasks held in place for a run (PENDING, blocked, under a claim:
-- migration 43) that nothing will run or give back: no PROCESSING task of
-- their key carries that claim any more, and the claim's worker is gone.
-- Stuck-task recovery returns held tasks only with their run's PROCESSING
-- task, so these would wait for ever. They arise when a worker built
-- before migration 43 ran on its schema (its heartbeat and its release at
-- shutdown know only PROCESSING rows, and let go of a run's running tasks
-- without its held ones), and from anything else that ends a run's
-- running tasks without its held ones. Each goes back to its key's line,
-- unclaimed, without an attempt (it never started); one an operator asked
-- to cancel is dead. (A run held without a write, migration 56, leaves no
-- orphan: its tasks between wait in their line, and only its PROCESSING
-- tasks carry the claim.) The key then goes to the first task in line, if
-- nothing holds it.
-- $1 clock override, $2 the maintenance leader running it (null for a
-- direct call), $3 batch size, $4 heartbeat timeout in microseconds: a
-- hold is taken back only once it is that old, as a running task is.
WITH orphans AS (
    SELECT h.id
    FROM outbox_tasks AS h
    WHERE h.blocked IS TRUE AND h.state = 'pending' AND h.claimed_by IS NOT NULL
      AND h.updated_at < coalesce($1::timestamptz, now()) - $4 * interval '1 microsecond'
      AND NOT EXISTS (
            SELECT 1 FROM outbox_tasks AS e
            WHERE e.queue = h.queue AND e.ordering_key = h.ordering_key
              AND e.state = 'processing' AND e.claimed_by = h.claimed_by
              -- As in recover_stuck.sql: lets the key holders' index serve.
              AND (e.dead_at IS NULL OR NOT e.skip_dead))
      AND NOT EXISTS (
            SELECT 1 FROM outbox_workers AS w
            WHERE w.expires_at > coalesce($1::timestamptz, now())
              AND left(h.claimed_by, length(w.id) + 1) = w.id || '/')
      AND ($2::text IS NULL OR EXISTS (
            SELECT 1 FROM outbox_leases
            WHERE name = 'maintenance' AND holder = $2 AND expires_at > now()))
    LIMIT $3
    FOR UPDATE SKIP LOCKED
),
done AS (
    UPDATE outbox_tasks AS t
    SET state = CASE WHEN t.cancel_requested_at IS NULL THEN 'pending'
                     ELSE 'failed' END::outbox_task_state,
        dead_at = CASE WHEN t.cancel_requested_at IS NOT NULL THEN coalesce($1::timestamptz, now()) END,
        last_error = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'cancelled by an operator'
                          ELSE t.last_error END,
        finished_at = CASE WHEN t.cancel_requested_at IS NOT NULL THEN coalesce($1::timestamptz, now()) END,
        blocked = t.cancel_requested_at IS NULL,
        claimed_by = NULL,
        heartbeat_at = NULL,
        execute_at = coalesce($1::timestamptz, now()),
        updated_at = coalesce($1::timestamptz, now())
    -- By `id = ANY` (migration 27), checked again once locked.
    WHERE t.id = ANY (ARRAY(SELECT orphans.id FROM orphans))
      AND t.state = 'pending' AND t.blocked AND t.claimed_by IS NOT NULL
    RETURNING t.id, t.queue, t.ordering_key
),
handed AS (
    SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key)) AS n
    FROM done
    HAVING count(*) > 0
)
SELECT id FROM done WHERE (SELECT count(*) FROM handed) >= 0
