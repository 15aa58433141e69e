-- Cancels the waiting steps of workflow $1 and returns the tasks of its
-- released steps, for cancel_tasks.sql in the same transaction (see
-- outbox_workflow_cancel, migrations 15 and 32). No row: no such workflow.
SELECT steps_cancelled::bigint AS steps_cancelled, tasks FROM outbox_workflow_cancel($1)
