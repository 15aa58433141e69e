-- One bounded batch of the inbox's retention: records older than it.
-- $1 retention in microseconds, $2 batch size, $3 clock override.
DELETE FROM outbox_inbox
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM outbox_inbox
    WHERE processed_at < coalesce($3::timestamptz, now()) - $1 * interval '1 microsecond'
    LIMIT $2))
