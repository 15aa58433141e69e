-- The aggregates of partition $3 (of $2) that subscription $1 holds back,
-- each with when its first event is due to be tried again.
SELECT DISTINCT ON (aggregatetype, aggregateid)
       aggregatetype::text, aggregateid::text, retry_at
FROM outbox_event_parked
WHERE subscription = $1 AND (aggregate_hash & 2147483647) % $2 = $3
ORDER BY aggregatetype, aggregateid, position
