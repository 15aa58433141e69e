-- Subscription $1's held-back events $5 were published: they go, if holder
-- $3 still holds partition $2 under fence $4, and count in the cursor's
-- published events as those event_advance.sql publishes do. Then each
-- event of $6, now the first of its aggregate, is tried again at its time
-- in $7 (null: when an operator says so) with its error in $8. Returns a
-- row when the holder still held it.
WITH fenced AS (
    SELECT 1 FROM outbox_event_cursors
    WHERE subscription = $1 AND part = $2 AND holder = $3 AND fence = $4
), gone AS (
    DELETE FROM outbox_event_parked
    WHERE subscription = $1 AND position = ANY ($5::bigint[]) AND EXISTS (SELECT 1 FROM fenced)
    RETURNING 1
), counted AS (
    UPDATE outbox_event_cursors
    SET published = published + (SELECT count(*) FROM gone)
    WHERE subscription = $1 AND part = $2 AND holder = $3 AND fence = $4
      AND cardinality($5::bigint[]) > 0
), again AS (
    UPDATE outbox_event_parked AS p SET retry_at = a.retry_at, error = a.error
    FROM unnest($6::bigint[], $7::timestamptz[], $8::text[]) AS a (position, retry_at, error)
    WHERE p.subscription = $1 AND p.position = a.position AND EXISTS (SELECT 1 FROM fenced)
)
SELECT 1 FROM fenced
