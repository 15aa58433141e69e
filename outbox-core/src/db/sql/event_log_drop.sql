-- Retention of the event log (outbox_event_log_drop, migration 12): drops
-- the oldest partition that ended over $1 microseconds before now ($3
-- clock override) and that every subscription has passed, or that ended
-- over $2 microseconds ago whatever they say; returns its name and
-- whether it was forced, or nulls.
SELECT dropped, forced
FROM outbox_event_log_drop(coalesce($3::timestamptz, now()) - $1 * interval '1 microsecond',
                           coalesce($3::timestamptz, now()) - $2 * interval '1 microsecond')
