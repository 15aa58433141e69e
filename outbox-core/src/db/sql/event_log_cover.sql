-- Makes sure a partition of the event log covers time $1, creating one $2
-- microseconds wide if none does (outbox_event_log_cover, migration 12);
-- returns whether it created one.
SELECT outbox_event_log_cover($1, $2 * interval '1 microsecond')
