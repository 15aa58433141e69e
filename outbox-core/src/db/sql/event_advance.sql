-- Moves the cursor of subscription $1's partition $2 to position $6 with
-- gaps $5 (and their bounds $9) after $7 more events were published, and
-- renews the lease for $8 microseconds, if holder $3 still holds it under
-- fence $4; returns a row then, none when the lease was lost (nothing is
-- written).
UPDATE outbox_event_cursors
SET gaps = $5::bigint[],
    gap_bounds = $9::bigint[],
    position = $6,
    published = published + $7,
    advanced_at = now(),
    lease_until = now() + $8 * interval '1 microsecond'
WHERE subscription = $1 AND part = $2 AND holder = $3 AND fence = $4
RETURNING 1
