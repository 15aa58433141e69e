-- Moves the cursor of subscription $1's partition $2 to snapshot $5 and
-- position $6 after $7 more events were published, and renews the lease
-- for $8 microseconds, if holder $3 still holds it under fence $4; returns
-- a row then, none when the lease was lost (nothing is written).
UPDATE outbox_event_cursors
SET snapshot = $5::pg_snapshot,
    position = $6,
    published = published + $7,
    advanced_at = now(),
    lease_until = now() + $8 * interval '1 microsecond'
WHERE subscription = $1 AND part = $2 AND holder = $3 AND fence = $4
RETURNING 1
