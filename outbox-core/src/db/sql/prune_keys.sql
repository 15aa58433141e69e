-- Deletes up to $1 lock rows of ordering keys added over a day ago whose tasks
-- have all finished. Ordering does not depend on the row (key_seq comes
-- from one sequence), so a key used again simply gets a new row.
DELETE FROM outbox_keys AS k
WHERE (k.queue, k.ordering_key) IN (
    SELECT queue, ordering_key FROM outbox_keys
    WHERE created_at < now() - interval '1 day'
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
  AND NOT EXISTS (
    SELECT 1 FROM outbox_tasks AS t
    WHERE t.queue = k.queue AND t.ordering_key = k.ordering_key
      AND t.ordering_key IS NOT NULL AND NOT t.blocked AND t.state <> 'completed'
      AND (t.dead_at IS NULL OR NOT t.skip_dead))
  AND NOT EXISTS (
    SELECT 1 FROM outbox_tasks AS t
    WHERE t.queue = k.queue AND t.ordering_key = k.ordering_key AND t.blocked)
