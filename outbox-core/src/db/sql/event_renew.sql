-- Renews holder $2's leases of subscription $1's partitions $3 (fences $4)
-- for $5 microseconds; returns the partitions it still holds (a lease
-- another holder took is gone, whatever this holder believed).
UPDATE outbox_event_cursors AS c
SET lease_until = now() + $5 * interval '1 microsecond'
FROM unnest($3::integer[], $4::bigint[]) AS h(part, fence)
WHERE c.subscription = $1 AND c.part = h.part AND c.fence = h.fence AND c.holder = $2
RETURNING c.part
