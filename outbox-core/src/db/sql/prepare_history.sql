-- Makes sure partitions of the history cover the time from now ($3 clock
-- override) through $1 microseconds ahead, each $2 microseconds wide
-- (outbox_history_prepare, migration 10); returns how many it created.
SELECT outbox_history_prepare(coalesce($3::timestamptz, now()),
                              coalesce($3::timestamptz, now()) + $1 * interval '1 microsecond',
                              $2 * interval '1 microsecond')
