-- Back to migration 23: the workflow tables' pages filled to the brim.
ALTER TABLE outbox_workflow_steps RESET (fillfactor);
ALTER TABLE outbox_workflows RESET (fillfactor);
