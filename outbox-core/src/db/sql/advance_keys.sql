-- Hands every ordering key that has waiting tasks and a free place (the
-- queue's per-key concurrency was raised, a task was finished behind the
-- engine's back, a waiting task an operator cancelled was passed over at
-- the very moment its key moved on, or a worker died owing a hand-over) to
-- its next tasks. Maintenance runs it now and then; `queues set` after a
-- change of per-key concurrency. $1 queue (null = all). Returns the tasks
-- handed their key.
--
-- Only keys that look free are locked, and each is checked again under
-- its lock (outbox_keys_let_go). A key whose task is running is
-- handed on by that task's outcome; locking every key with waiting tasks
-- would make those outcomes wait for this statement, and a busy ordered
-- queue has a thousand such keys. A key whose lock another transaction holds for more
-- than 50 ms (an open submit) is passed over: the next run takes it
-- (migration 23).
WITH free AS (
    SELECT w.queue, w.ordering_key
    FROM (SELECT DISTINCT queue, ordering_key FROM outbox_tasks
          WHERE blocked AND ($1::text IS NULL OR queue = $1)) AS w
    LEFT JOIN outbox_queues AS s ON s.name = w.queue
    WHERE (SELECT count(*) FROM (
               SELECT 1 FROM outbox_tasks AS h
               WHERE h.queue = w.queue AND h.ordering_key = w.ordering_key
                 AND h.ordering_key IS NOT NULL AND (NOT h.blocked OR h.state = 'processing')
                 AND h.state <> 'completed' AND (h.dead_at IS NULL OR NOT h.skip_dead)
               LIMIT coalesce(s.per_key_concurrency, 1)) AS holders)
          < coalesce(s.per_key_concurrency, 1)
)
SELECT count(*) FILTER (WHERE l.deferred_key IS NULL)
FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k FROM free
      HAVING count(*) > 0) AS waiting,
     LATERAL outbox_keys_let_go(waiting.q, waiting.k, interval '50 milliseconds', '{}'::text[],
                                '{}'::int[], NULL::text, NULL::timestamptz) AS l
