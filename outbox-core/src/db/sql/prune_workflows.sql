-- One bounded batch of the workflows' retention: workflows that finished
-- before it, with their steps and edges (foreign keys cascade). Running
-- and compensating workflows (finished_at null) are kept however old. A
-- dead step's task outlives its failed workflow (dead tasks are the audit
-- trail); retried after the workflow is gone, it runs on its own.
-- $1 retention in microseconds, $2 batch size (workflows), $3 clock
-- override.
DELETE FROM outbox_workflows
WHERE id IN (
    SELECT id FROM outbox_workflows
    WHERE finished_at < coalesce($3::timestamptz, now()) - $1 * interval '1 microsecond'
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
