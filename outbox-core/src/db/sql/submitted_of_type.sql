-- Test helper: tasks of one type visible on this connection (including
-- ones submitted by its own open transaction), oldest first.
SELECT id, payload::text AS payload FROM outbox_all_tasks WHERE task_type = $1 ORDER BY id
