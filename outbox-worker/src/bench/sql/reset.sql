-- Removes every task the benchmark wrote, live and finished.
DELETE FROM outbox_tasks WHERE queue IN ('outbox-bench', 'outbox-bench-submit');
DELETE FROM outbox_task_history WHERE queue IN ('outbox-bench', 'outbox-bench-submit');
