-- The first statement of taking back key places (take_back_key_places.sql
-- is the second, in the same transaction), after a change of queue $1's
-- per-key concurrency committed: locks the keys that have more holders
-- (the holders' index's predicate, migration 28: a run's tasks hold their
-- key, blocked) than the setting allows and a holder that has not started,
-- in the order every hand-over locks keys. Returns them.
SELECT o.ordering_key
FROM outbox_keys AS o
WHERE o.queue = $1
  AND o.ordering_key IN (
      SELECT t.ordering_key
      FROM outbox_tasks AS t
      WHERE t.queue = $1 AND t.ordering_key IS NOT NULL
        AND (NOT t.blocked OR t.state = 'processing')
        AND t.state <> 'completed' AND (t.dead_at IS NULL OR NOT t.skip_dead)
      GROUP BY t.ordering_key
      HAVING count(*) > (SELECT per_key_concurrency FROM outbox_queues WHERE name = $1)
         AND bool_or(t.state <> 'processing'))
ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
FOR UPDATE OF o
