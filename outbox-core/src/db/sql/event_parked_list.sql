-- Held-back events, of subscription $1 (or every one when null), the first
-- of each aggregate first, at most $2.
SELECT p.subscription, p.aggregatetype::text AS aggregatetype, p.aggregateid::text AS aggregateid,
       p.position, p.id::text AS id, p.type::text AS type, p.parked_at, p.retry_at, p.error,
       p.publish_at
FROM outbox_event_parked AS p
WHERE $1::text IS NULL OR p.subscription = $1
ORDER BY p.subscription, p.aggregatetype, p.aggregateid, p.position
LIMIT $2
