-- When the first aggregate that partition $3 (of $2) of subscription $1
-- holds back is due to be tried again (null: none has a time), read in
-- the due index's order; and the database's time, which is what says
-- when an event is due.
SELECT min(retry_at) AS soonest, now() AS now FROM outbox_event_parked
WHERE subscription = $1 AND retry_at IS NOT NULL AND (aggregate_hash & 2147483647) % $2 = $3
