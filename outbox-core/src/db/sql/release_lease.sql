-- A leader stepping down (shutdown) hands the lease over at once instead
-- of letting it run out. $1 lease name, $2 holder.
UPDATE outbox_leases
SET expires_at = now()
WHERE name = $1 AND holder = $2
