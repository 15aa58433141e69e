-- Operator stats: every task counted by type and state (dead apart). Reads
-- the whole table: for the CLI, not for a tight loop.
SELECT task_type,
       CASE WHEN dead_at IS NOT NULL THEN 'dead' ELSE state::text END AS state,
       count(*) AS count
FROM outbox_all_tasks
GROUP BY 1, 2
ORDER BY 1, 2
