-- The aggregates of partition $3 (of $2) that subscription $1 holds back.
SELECT DISTINCT aggregatetype::text, aggregateid::text
FROM outbox_event_parked
WHERE subscription = $1 AND (aggregate_hash & 2147483647) % $2 = $3
