-- Retention of the history: drops the oldest partition whose tasks all
-- finished more than $1 microseconds before now ($2 clock override), whole
-- (outbox_history_drop, migration 10); returns its name, or null when none
-- is left.
SELECT outbox_history_drop(coalesce($2::timestamptz, now()) - $1 * interval '1 microsecond')
