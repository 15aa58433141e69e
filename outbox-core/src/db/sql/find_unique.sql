-- The tasks holding these full unique keys in a covered state (the
-- predicate of outbox_tasks_unique_idx, word for word).
SELECT unique_key, id
FROM outbox_tasks
WHERE unique_key = ANY($1::text[])
  AND unique_key IS NOT NULL
  AND outbox_unique_covers(unique_states, state, dead_at IS NOT NULL)
