-- One bounded batch of the workflows' retention: workflows that finished
-- before it, with their steps and edges. Running and compensating
-- workflows (finished_at null) are kept however old. A dead step's task
-- outlives its failed workflow (dead tasks are the audit trail); retried
-- after the workflow is gone, it runs with no workflow to move on
-- (ctx.parent_results finds no parents, ctx.step_result refuses). $1 retention in
-- microseconds, $2 batch size (workflows), $3 clock override. Returns (as
-- the rows affected) the workflows deleted.
WITH doomed AS (
    SELECT id FROM outbox_workflows
    WHERE finished_at < coalesce($3::timestamptz, now()) - $1 * interval '1 microsecond'
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
steps AS (
    DELETE FROM outbox_workflow_steps WHERE workflow_id IN (SELECT id FROM doomed)
),
edges AS (
    DELETE FROM outbox_workflow_edges WHERE workflow_id IN (SELECT id FROM doomed)
)
DELETE FROM outbox_workflows WHERE id IN (SELECT id FROM doomed)
