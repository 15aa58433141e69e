-- One bounded batch of cleanup: COMPLETED tasks finished before the
-- retention, oldest first, through outbox_tasks_completed_idx (no table
-- scan, no long transaction). FAILED rows are the audit trail: kept.
-- $1 retention in microseconds, $2 batch size, $3 clock override.
DELETE FROM outbox_tasks
WHERE id IN (
    SELECT id
    FROM outbox_tasks
    WHERE state = 'completed'
      AND finished_at < coalesce($3::timestamptz, now()) - $1 * interval '1 microsecond'
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
