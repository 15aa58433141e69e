-- Holder $2 lets go of subscription $1's partitions $3 (fences $4), so
-- another relay worker takes them at once.
UPDATE outbox_event_cursors AS c
SET holder = NULL, lease_until = NULL
FROM unnest($3::integer[], $4::bigint[]) AS h(part, fence)
WHERE c.subscription = $1 AND c.part = h.part AND c.fence = h.fence AND c.holder = $2
