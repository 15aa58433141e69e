-- Retention of the history: drops every partition whose tasks all finished
-- more than $1 microseconds before now ($2 clock override), whole; returns
-- the names of the partitions dropped.
SELECT outbox_history_drop(coalesce($2::timestamptz, now()) - $1 * interval '1 microsecond') AS name
