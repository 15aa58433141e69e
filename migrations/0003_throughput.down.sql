DROP INDEX IF EXISTS outbox_tasks_dead_queue_idx;
DROP TABLE IF EXISTS outbox_throughput;
