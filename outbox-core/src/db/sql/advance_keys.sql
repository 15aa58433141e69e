-- Hands every ordering key that has waiting tasks and a free place (the
-- queue's per-key concurrency was raised, a task was finished behind the
-- engine's back, or a waiting task an operator cancelled was passed over
-- at the very moment its key moved on) to its next tasks. Maintenance runs
-- it now and then; `queues set` after a change of per-key concurrency.
-- $1 queue (null = all). Returns the tasks handed their key.
SELECT coalesce(outbox_keys_advance(array_agg(w.queue), array_agg(w.ordering_key)), 0)::bigint
FROM (SELECT DISTINCT queue, ordering_key FROM outbox_tasks
      WHERE blocked AND ($1::text IS NULL OR queue = $1)) AS w
