-- Operator removal of periodic task $1 (periodic delete): its record and
-- the ticks it enqueued ahead and never started (matched as declare_
-- periodic.sql matches them). Runs after lock_periodic.sql, in the same
-- transaction: the record is locked, so no leader enqueues ticks of it
-- meanwhile, and this statement's snapshot sees every tick one enqueued
-- before. Refused, deleting nothing, when the current maintenance leader
-- recorded the declaration during its leadership (its code declares it:
-- the leader's next rounds would enqueue nothing, and the next leader
-- would record it again), unless $2 (force). A leadership begins again
-- when its holder takes back a lease that ran out (acquire_lease.sql), and
-- declares again. Returns whether the record existed, whether the current
-- leader declares it, whether it was deleted, and how many ticks were
-- taken back.
WITH p AS (
    SELECT name, task_type, queue, updated_at FROM outbox_periodic WHERE name = $1
),
live AS (
    SELECT EXISTS (SELECT 1 FROM p, outbox_leases AS l
                   WHERE l.name = 'maintenance' AND l.expires_at > now()
                     AND p.updated_at >= l.acquired_at) AS declared
),
gone AS (
    DELETE FROM outbox_periodic AS d
    USING p, live
    WHERE d.name = p.name AND ($2::boolean OR NOT live.declared)
    RETURNING d.name, d.task_type, d.queue
),
dropped AS (
    DELETE FROM outbox_tasks AS t
    USING gone AS g
    WHERE t.queue = g.queue AND t.task_type = g.task_type
      AND t.state = 'pending' AND t.claims = 0 AND t.dead_at IS NULL
      AND t.execute_at > now()
      AND left(t.unique_key, length('periodic:' || $1 || ':')) = 'periodic:' || $1 || ':'
      AND substr(t.unique_key, length('periodic:' || $1 || ':') + 1) ~ '^[0-9]+$'
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM p) AS found,
       (SELECT declared FROM live) AS declared,
       EXISTS (SELECT 1 FROM gone) AS deleted,
       (SELECT count(*) FROM dropped) AS dropped
