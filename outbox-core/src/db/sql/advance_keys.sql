-- Hands every ordering key that has waiting tasks and a free place (the
-- queue's per-key concurrency was raised, a task was finished behind the
-- engine's back, a waiting task an operator cancelled was passed over at
-- the very moment its key moved on, or a worker died owing a hand-over) to
-- its next tasks. Maintenance runs it now and then; `queues set` after a
-- change of per-key concurrency. A key whose lock another transaction
-- holds for more than 50 ms (an open submit) is passed over rather than
-- waited for: the next run takes it (migration 23). $1 queue (null = all).
-- Returns the tasks handed their key.
WITH keys AS (
    SELECT l.*
    FROM (SELECT array_agg(w.queue) AS q, array_agg(w.ordering_key) AS k
          FROM (SELECT DISTINCT queue, ordering_key FROM outbox_tasks
                WHERE blocked AND ($1::text IS NULL OR queue = $1)) AS w
          HAVING count(*) > 0) AS waiting,
         LATERAL outbox_keys_try_lock(waiting.q, waiting.k, interval '50 milliseconds') AS l
)
SELECT coalesce((SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key))
                 FROM keys WHERE held
                 HAVING count(*) > 0), 0)::bigint
