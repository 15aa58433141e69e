-- Removes every task the benchmark wrote.
DELETE FROM outbox_tasks WHERE queue IN ('outbox-bench', 'outbox-bench-submit')
