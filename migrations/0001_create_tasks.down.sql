DROP TABLE IF EXISTS outbox_tasks;
DROP TYPE IF EXISTS outbox_task_state;
