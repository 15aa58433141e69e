-- A task's stored result and state: $1 id.
SELECT state::text AS state, result::text AS result FROM outbox_all_tasks WHERE id = $1
