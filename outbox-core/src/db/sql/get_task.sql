SELECT id, task_type, queue,
       CASE WHEN dead_at IS NOT NULL THEN 'dead' ELSE state::text END AS state,
       priority, retry_count, max_attempts, claims, execute_at, created_at, updated_at,
       finished_at, dead_at, claimed_by, heartbeat_at, last_error, unique_key,
       ordering_key, key_seq, blocked, skip_dead, attempted_at, result::text AS result,
       payload::text AS payload
FROM outbox_all_tasks
WHERE id = $1
