-- An operator asks subscription $1 to try aggregate $2/$3's held-back
-- events again now, from the first; $4 skips the first instead (it is
-- dropped, and the rest are tried). A retry with $6 also cuts the first
-- event's own delay short; it names the event, $5, and acts only when
-- that one is still first, so a stale or repeated "publish now" cuts no
-- later event's delay. A skip drops only an event the broker refused
-- (not one merely delayed, nor the next one that a first skip made due),
-- and only event $5 when it is given (the one the operator saw), so a
-- repeated or stale skip drops nothing; a delayed first event is dropped
-- only when $5 names it. Returns the first event's id (the skipped one's
-- when skipping), or no row when nothing is held back or nothing was
-- skipped (also when a concurrent skip, or the relay publishing the
-- event, took it first).
WITH first AS (
    SELECT position, id, error, publish_at FROM outbox_event_parked
    WHERE subscription = $1 AND aggregatetype = $2 AND aggregateid = $3
    ORDER BY position LIMIT 1
), acted AS (
    SELECT position, id FROM first
    WHERE (NOT $4 AND ($5::uuid IS NULL OR id = $5::uuid))
       OR (error IS NOT NULL AND ($5::uuid IS NULL OR id = $5::uuid))
       OR (id = $5::uuid AND publish_at > now())
), skipped AS (
    DELETE FROM outbox_event_parked AS p USING acted
    WHERE $4 AND p.subscription = $1 AND p.position = acted.position
    RETURNING p.position, p.id
), done AS (
    SELECT position, id FROM acted WHERE NOT $4
    UNION ALL
    SELECT position, id FROM skipped
), retried AS (
    UPDATE outbox_event_parked AS p
    SET retry_at = now(),
        publish_at = CASE WHEN $6 AND p.publish_at > now() THEN now() ELSE p.publish_at END
    WHERE p.subscription = $1 AND p.aggregatetype = $2 AND p.aggregateid = $3
      AND p.position = (SELECT min(q.position) FROM outbox_event_parked AS q, done
                        WHERE q.subscription = $1 AND q.aggregatetype = $2 AND q.aggregateid = $3
                          AND (q.position > done.position OR NOT $4))
)
SELECT id::text FROM done
