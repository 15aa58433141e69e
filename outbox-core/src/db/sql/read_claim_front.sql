-- Where the last slow walk of queue $1's claimable index found its first
-- task, how long that walk took, and how long ago it ended, by the
-- database's clock (migration 35).
SELECT priority, execute_at, id, walk_ms,
       greatest(extract(epoch FROM now() - walked_at), 0)::double precision AS age_s
FROM outbox_claim_fronts
WHERE queue = $1
