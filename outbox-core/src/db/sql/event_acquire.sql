-- Leases up to $4 partitions of subscription $1 whose lease ran out (on
-- the database's clock) or was let go (no time: a holder that let go
-- publishes nothing more), to holder $2 for $3 microseconds. A partition
-- a rewind took from its holder keeps that holder and its lease's time
-- (event_rewind.sql), and waits for it. Each gets a new fence, which every later write of the holder names.
-- Returns them with their cursors.
UPDATE outbox_event_cursors AS c
SET holder = $2,
    lease_until = now() + $3 * interval '1 microsecond',
    fence = c.fence + 1
FROM (SELECT part FROM outbox_event_cursors
      WHERE subscription = $1 AND (lease_until IS NULL OR lease_until < now())
      ORDER BY part
      LIMIT $4
      FOR UPDATE SKIP LOCKED) AS free
WHERE c.subscription = $1 AND c.part = free.part
RETURNING c.part, c.fence, c.position, c.gaps, c.gap_bounds
