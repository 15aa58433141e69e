-- Tasks for operators (the CLI's tasks list, the dashboard), newest first,
-- one page at a time: keyset paging on the primary key ($6: ids below this
-- one), so page 1000 costs what page 1 does. Filters, each null for "any":
-- $1 state (a state name, or 'dead' for dead tasks, which are excluded
-- from 'failed'), $2 task type, $3 queue, $4 id, $5 a LIKE pattern (already
-- escaped and wrapped in %) matched against the payload text and the last
-- error. $7 page size. $8 leaves payloads and results out. Every value is bound; nothing here is built from
-- request text.
SELECT id, task_type, queue,
       CASE WHEN dead_at IS NOT NULL THEN 'dead' ELSE state::text END AS state,
       priority, retry_count, max_attempts, claims, execute_at, created_at, updated_at,
       finished_at, dead_at, claimed_by, heartbeat_at, last_error, unique_key,
       ordering_key, key_seq, blocked, skip_dead, attempted_at,
       CASE WHEN NOT $8 THEN result::text END AS result,
       CASE WHEN $8 THEN 'null' ELSE payload::text END AS payload
FROM outbox_all_tasks
WHERE ($1::text IS NULL
       OR ($1 = 'dead' AND dead_at IS NOT NULL)
       OR ($1 <> 'dead' AND state::text = $1 AND dead_at IS NULL))
  AND ($2::text IS NULL OR task_type = $2)
  AND ($3::text IS NULL OR queue = $3)
  AND ($4::bigint IS NULL OR id = $4)
  AND ($5::text IS NULL OR payload::text ILIKE $5 OR last_error ILIKE $5)
  AND ($6::bigint IS NULL OR id < $6)
ORDER BY id DESC
LIMIT $7
