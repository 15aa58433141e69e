-- The held-back events of partition $3 (of $2) of subscription $1 whose
-- aggregate is due to be tried again (its first event's retry_at has
-- come), in order, at most $4.
WITH firsts AS (
    SELECT DISTINCT ON (aggregatetype, aggregateid) aggregatetype, aggregateid, retry_at
    FROM outbox_event_parked
    WHERE subscription = $1 AND (aggregate_hash & 2147483647) % $2 = $3
    ORDER BY aggregatetype, aggregateid, position
)
SELECT p.position, p.id::text AS id, p.aggregatetype::text AS aggregatetype,
       p.aggregateid::text AS aggregateid, p.type::text AS type,
       p.payload::text AS payload, p.headers,
       p.publish_at, p.created_at, p.aggregate_hash
FROM outbox_event_parked AS p
JOIN firsts AS f USING (aggregatetype, aggregateid)
WHERE p.subscription = $1 AND f.retry_at <= now()
ORDER BY p.position
LIMIT $4
