-- Maintenance: removes rows of workers silent for longer than $1
-- microseconds past their expiry (gone for long: killed, or their machine
-- lost). Returns their ids.
DELETE FROM outbox_workers
WHERE expires_at < now() - $1 * interval '1 microsecond'
RETURNING id
