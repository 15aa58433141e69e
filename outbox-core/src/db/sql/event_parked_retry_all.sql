-- An operator asks subscription $1 to try every aggregate the broker
-- refused again now (of aggregate type $2 only, when given), each from
-- its first held-back event: only that event carries the error (migration
-- 37). Delayed aggregates keep their time. Returns how many.
WITH retried AS (
    UPDATE outbox_event_parked SET retry_at = now()
    WHERE subscription = $1 AND error IS NOT NULL
      AND ($2::text IS NULL OR aggregatetype = $2)
    RETURNING 1
)
SELECT count(*) FROM retried
