-- Who holds lease $1 now (by the database's clock), and the settings it
-- applies (migration 51; null from a holder of an older build).
SELECT holder, settings FROM outbox_leases WHERE name = $1 AND expires_at > now()
