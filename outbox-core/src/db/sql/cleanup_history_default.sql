-- One bounded batch of retention for the history's default partition,
-- which holds only what finished while no partition covered its time
-- (maintenance stopped for days, a test's clock): rows finished before the
-- retention, oldest first, through its finished_at index.
-- $1 retention in microseconds, $2 batch size, $3 clock override.
DELETE FROM outbox_task_history_default
WHERE ctid IN (
    SELECT ctid
    FROM outbox_task_history_default
    WHERE finished_at < coalesce($3::timestamptz, now()) - $1 * interval '1 microsecond'
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
