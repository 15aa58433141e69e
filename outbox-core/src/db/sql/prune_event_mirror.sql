-- One bounded batch of the Debezium mirror's retention (Debezium reads the
-- log, not the table). $1 retention in microseconds, $2 batch size, $3
-- clock override.
DELETE FROM outbox_events
WHERE id = ANY (ARRAY(
    SELECT id FROM outbox_events
    WHERE created_at < coalesce($3::timestamptz, now()) - $1 * interval '1 microsecond'
    LIMIT $2))
