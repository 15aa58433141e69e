-- The end of an outcome statement that hands keys on in runs (migration
-- 46): the worker sends `WITH o AS MATERIALIZED (` followed by
-- complete_tasks.sql or delete_completed_tasks.sql and then this, when it
-- offers places and takes runs. $11 int: the run's length, its first task
-- included. Each task handed on and claimed comes with the tasks waiting
-- behind it in its key's line, up to $11 in all; their rows say which
-- head's run they are (run_of).
--
-- The runs are claimed once outbox_complete_tasks has returned: it hands
-- the keys on in statements of its own, whose writes those of
-- outbox_hold_runs see. Their tasks between a run's head and its last are
-- held in place without a write (migration 56), as a claim's are.
),
handed AS (
    SELECT ARRAY(SELECT o.id FROM o WHERE o.handed AND o.claimed) AS heads
)
SELECT o.*, NULL::bigint AS run_of FROM o
UNION ALL
SELECT r.id, true, true, r.queue, r.task_type, r.payload, r.retry_count, r.max_attempts, r.claims,
       r.key_seq, r.created_at, r.trace_context, true, r.workflow_id, NULL, NULL, NULL, r.run_of
FROM handed CROSS JOIN LATERAL outbox_hold_runs(handed.heads, $7::text, $11::int,
                                                $4::timestamptz, true) AS r
WHERE cardinality(handed.heads) > 0
