-- After a queue's per-key concurrency changed (queues set), the keys $2
-- of queue $1 locked by lock_crowded_keys.sql in the same transaction: a
-- key's tasks that were handed their key under a higher setting and have
-- not started (pending, or failed and waiting for a retry) beyond what the
-- setting allows wait for their key again, last in key order first.
-- Running tasks finish (as for a global concurrency that is lowered) and
-- count against the setting. This statement's snapshot, taken after the
-- keys were locked, sees what hand-overs did meanwhile; a claim that takes
-- one of these tasks first wins, and its task runs (the update re-checks
-- the state). Returns how many tasks were taken back.
WITH s AS (
    SELECT per_key_concurrency AS n FROM outbox_queues WHERE name = $1
),
holders AS (
    SELECT t.id, t.state,
           row_number() OVER (PARTITION BY t.ordering_key
                              ORDER BY t.state = 'processing' DESC, t.key_seq) AS place
    FROM outbox_tasks AS t
    -- The holders' index's predicate (migration 28).
    WHERE t.queue = $1 AND t.ordering_key = ANY ($2::text[])
      AND (NOT t.blocked OR t.state = 'processing')
      AND t.state <> 'completed' AND (t.dead_at IS NULL OR NOT t.skip_dead)
),
taken AS (
    UPDATE outbox_tasks AS t
    SET blocked = true, updated_at = now()
    WHERE t.id IN (SELECT h.id FROM holders AS h, s WHERE h.place > s.n AND h.state <> 'processing')
      AND t.state <> 'processing' AND NOT t.blocked AND t.dead_at IS NULL
    RETURNING 1
)
SELECT count(*) FROM taken
