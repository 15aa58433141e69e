-- Makes sure a partition of the history covers time $1, creating one $2
-- microseconds wide if none does (outbox_history_cover, migration 10);
-- returns whether it created one.
SELECT outbox_history_cover($1, $2 * interval '1 microsecond')
