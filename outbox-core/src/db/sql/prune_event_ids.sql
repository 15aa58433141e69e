-- One bounded batch of emit_once's id records older than the event log's
-- maximum age. $1 that age in microseconds, $2 batch size, $3 clock
-- override.
DELETE FROM outbox_event_ids
WHERE id = ANY (ARRAY(
    SELECT id FROM outbox_event_ids
    WHERE emitted_at < coalesce($3::timestamptz, now()) - $1 * interval '1 microsecond'
    ORDER BY emitted_at
    LIMIT $2))
