DROP FUNCTION outbox_workflow_submit(text, text[], text[], text[], text[], smallint[], integer[],
                                     timestamptz[], bigint[], text[], boolean[], text[], text[],
                                     text[], text[]);
DROP TRIGGER outbox_workflow_flush_dead ON outbox_tasks;
DROP TRIGGER outbox_workflow_flush_deleted ON outbox_tasks;
DROP TRIGGER outbox_workflow_dead ON outbox_tasks;
DROP TRIGGER outbox_workflow_complete ON outbox_tasks;
DROP FUNCTION outbox_workflow_sweep(bigint, integer);
DROP FUNCTION outbox_workflow_settle_notes(text);
DROP FUNCTION outbox_workflow_flush();
DROP FUNCTION outbox_workflow_note();
DROP FUNCTION outbox_workflow_cancel(bigint);
DROP FUNCTION outbox_workflow_revive(bigint, text, bigint);
DROP FUNCTION outbox_workflow_settle(bigint[], text[]);
DROP FUNCTION outbox_workflow_finish(bigint);
DROP FUNCTION outbox_workflow_release(bigint, text[]);
DROP FUNCTION outbox_workflow_release_steps(bigint[], text[]);
DROP TABLE outbox_workflow_edges;
DROP TABLE outbox_workflow_steps;
DROP TABLE outbox_workflows;
ALTER TABLE outbox_tasks DROP COLUMN workflow_step, DROP COLUMN workflow_id;
DROP TABLE outbox_durable_steps;
DROP TABLE outbox_task_signals;
