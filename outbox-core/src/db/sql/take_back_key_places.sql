-- After a queue's per-key concurrency changed (queues set), in the same
-- transaction, which holds the queue's row: a key's tasks that were handed
-- their key under a higher setting and have not started (pending, or
-- failed and waiting for a retry) beyond what the new setting allows wait
-- for their key again, last in key order first. Running tasks finish (as
-- for a global concurrency that is lowered) and count against the
-- setting. The keys are locked first, in the order every hand-over takes
-- them. Claims wait for the queue's row, so none is in flight; a later one
-- sees these tasks blocked. $1 queue. Returns how many were taken back.
WITH s AS (
    SELECT per_key_concurrency AS n FROM outbox_queues WHERE name = $1
),
holders AS (
    SELECT t.id, t.ordering_key, t.state,
           row_number() OVER (PARTITION BY t.ordering_key
                              ORDER BY t.state = 'processing' DESC, t.key_seq) AS place
    FROM outbox_tasks AS t
    -- The holders' index's predicate (migration 28): a run's tasks hold
    -- their key, blocked.
    WHERE t.queue = $1 AND t.ordering_key IS NOT NULL AND (NOT t.blocked OR t.state = 'processing')
      AND t.state <> 'completed' AND (t.dead_at IS NULL OR NOT t.skip_dead)
),
excess AS (
    SELECT h.id, h.ordering_key
    FROM holders AS h, s
    WHERE h.place > s.n AND h.state <> 'processing'
),
keys AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM outbox_keys AS o
        WHERE o.queue = $1 AND o.ordering_key IN (SELECT ordering_key FROM excess)
        ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
        FOR UPDATE OF o) AS l
),
taken AS (
    UPDATE outbox_tasks AS t
    SET blocked = true, updated_at = now()
    WHERE t.id IN (SELECT id FROM excess)
      AND t.state <> 'processing' AND NOT t.blocked AND t.dead_at IS NULL
      AND (SELECT n FROM keys) >= 0
    RETURNING 1
)
SELECT count(*) FROM taken
