-- Maintenance's safety net for workflows (outbox_workflow_sweep, migration
-- 15). $1 quiet time in microseconds, $2 most steps settled.
SELECT outbox_workflow_sweep($1, $2::integer)
