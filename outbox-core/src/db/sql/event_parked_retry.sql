-- An operator asks subscription $1 to try aggregate $2/$3's held-back
-- events again now, from the first; $4 skips the first instead (it is
-- dropped, and the rest are tried). Returns the first event's id (the
-- skipped one's when skipping), or no row when nothing is held back.
WITH first AS (
    SELECT position, id FROM outbox_event_parked
    WHERE subscription = $1 AND aggregatetype = $2 AND aggregateid = $3
    ORDER BY position LIMIT 1
), skipped AS (
    DELETE FROM outbox_event_parked AS p USING first
    WHERE $4 AND p.subscription = $1 AND p.position = first.position
), retried AS (
    UPDATE outbox_event_parked AS p SET retry_at = now()
    WHERE p.subscription = $1 AND p.aggregatetype = $2 AND p.aggregateid = $3
      AND p.position = (SELECT min(q.position) FROM outbox_event_parked AS q, first
                        WHERE q.subscription = $1 AND q.aggregatetype = $2 AND q.aggregateid = $3
                          AND (q.position > first.position OR NOT $4))
)
SELECT id::text FROM first
