-- Writes a workflow and releases its steps that depend on nothing (see
-- outbox_workflow_submit, migration 15). The arrays are checked by
-- Workflow::validate first.
SELECT outbox_workflow_submit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
