-- Maintenance: per-minute outcome counts older than a day go ($1 overrides
-- the clock in tests; null means now()).
DELETE FROM outbox_throughput
WHERE minute < coalesce($1::timestamptz, now()) - interval '1 day'
