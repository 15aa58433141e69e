-- An operator asks subscription $1 to try every aggregate the broker
-- refused again now (of aggregate type $2 only, when given), each from
-- its first held-back event, which carries the error. Only a first event
-- may carry a time (migration 37): an error left on a later one by a race
-- is passed over. Delayed aggregates keep their time. Returns how many.
WITH retried AS (
    UPDATE outbox_event_parked AS p SET retry_at = now()
    WHERE p.subscription = $1 AND p.error IS NOT NULL
      AND ($2::text IS NULL OR p.aggregatetype = $2)
      AND NOT EXISTS (SELECT 1 FROM outbox_event_parked AS q
                      WHERE q.subscription = p.subscription AND q.aggregatetype = p.aggregatetype
                        AND q.aggregateid = p.aggregateid AND q.position < p.position)
    RETURNING 1
)
SELECT count(*) FROM retried
