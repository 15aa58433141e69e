-- Removes every task the benchmark wrote, live and finished, and those
-- still in the intake (single submits no worker claimed).
-- The intake first, so that no task a claim moves meanwhile is left.
DELETE FROM outbox_intake WHERE queue IN ('outbox-bench', 'outbox-bench-submit');
DELETE FROM outbox_tasks WHERE queue IN ('outbox-bench', 'outbox-bench-submit');
DELETE FROM outbox_task_history WHERE queue IN ('outbox-bench', 'outbox-bench-submit');
