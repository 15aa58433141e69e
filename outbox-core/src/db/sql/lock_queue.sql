-- The first statement of a limited queue's claim transaction: takes the
-- queue's row FOR UPDATE, so claims of the queue run one at a time across
-- the cluster (each counts what the one before it claimed) and wait for
-- unlimited claims still in flight. $1 queue.
SELECT name FROM outbox_queues WHERE name = $1 FOR UPDATE
