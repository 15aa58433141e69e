-- Operator removal of a queue's settings row (queues delete), for a queue
-- left behind: refused, deleting nothing, while a live worker serves the
-- queue (it would add the row back, without the settings, within a
-- second) or a task waits or runs on it (each condition read through the
-- index that covers it). $1 queue. Returns whether the row existed, the
-- live workers serving the queue, whether tasks wait or run on it, and
-- whether the row was deleted.
WITH q AS (
    SELECT name FROM outbox_queues WHERE name = $1 FOR UPDATE
),
served AS (
    SELECT count(*) AS n
    FROM outbox_workers
    WHERE expires_at > now() AND queues @> jsonb_build_array(jsonb_build_object('queue', $1::text))
),
unfinished AS (
    SELECT EXISTS (SELECT 1 FROM outbox_tasks
                   WHERE queue = $1 AND state IN ('pending', 'failed') AND dead_at IS NULL
                     AND NOT blocked)
        OR EXISTS (SELECT 1 FROM outbox_tasks WHERE queue = $1 AND blocked AND dead_at IS NULL)
        OR EXISTS (SELECT 1 FROM outbox_tasks WHERE state = 'processing' AND queue = $1)
        OR EXISTS (SELECT 1 FROM outbox_intake WHERE queue = $1) AS present
),
gone AS (
    DELETE FROM outbox_queues AS d
    USING q, served, unfinished
    WHERE d.name = q.name AND served.n = 0 AND NOT unfinished.present
    RETURNING d.name
),
-- The queue's last slow walk goes with it (migration 35; a statement
-- that modifies rows runs whether or not it is read).
front AS (
    DELETE FROM outbox_claim_fronts AS f USING gone WHERE f.queue = gone.name
)
SELECT EXISTS (SELECT 1 FROM q) AS found,
       (SELECT n FROM served) AS served,
       (SELECT present FROM unfinished) AS unfinished,
       EXISTS (SELECT 1 FROM gone) AS deleted
