-- Subscription $1's held-back events $5 were published: they go, if holder
-- $3 still holds partition $2 under fence $4, and count in the cursor's
-- published events as those event_advance.sql publishes do. Then each
-- event of $6, now the first of its aggregate, is tried again at its time
-- in $7 (null: when an operator says so) with its error in $8. Each
-- aggregate of $9/$10 (types and ids: its events were all published, but
-- the look did not read them all) that has events left has its first one
-- tried now: only a first event carries a time (migration 37). $11 has,
-- for each event of $6, its row's version (`xmin`) as the look read it.
-- Returns a row when the holder still held it.
WITH fenced AS (
    -- Locked: a worker taking the partition over (a new fence) cannot
    -- while this runs (its acquire skips locked rows), so its sweep sees
    -- what this deleted, and this, coming after, writes nothing.
    -- Unlocked, a stale holder's unpark could delete a first event after
    -- the new holder parked events behind it without a time, leaving
    -- them none until its next sweep.
    SELECT 1 FROM outbox_event_cursors
    WHERE subscription = $1 AND part = $2 AND holder = $3 AND fence = $4
    FOR SHARE
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
    -- An event not due yet is tried at its time, or at the one an
    -- operator's `retry --now` gave it since the look read it (the
    -- row's publish_at, re-read under its lock): else this would put
    -- back the delay the operator just cut short. Likewise a refused one
    -- keeps the time an operator's retry gave it since the look read it
    -- (the row is another version than the look read: between the look
    -- and this statement, only an operator's retry or skip writes a
    -- first event that has a time; this holder's own writes come in
    -- turn, and a sweep writes only a first event without a time, or a
    -- later one): else this attempt's refusal would undo a retry the
    -- operator made after fixing the broker, and the aggregate would wait
    -- for another. By the version, not by the retry's time: a retry whose
    -- transaction began before the look and committed after it has an
    -- earlier time.
    UPDATE outbox_event_parked AS p
    SET retry_at = CASE WHEN a.error IS NULL AND a.retry_at IS NOT NULL
                        THEN least(a.retry_at, p.publish_at)
                        WHEN a.error IS NOT NULL AND p.retry_at IS NOT NULL
                             AND p.xmin::text <> a.seen
                        THEN p.retry_at
                        ELSE a.retry_at END,
        error = a.error
    FROM unnest($6::bigint[], $7::timestamptz[], $8::text[], $11::text[])
         AS a (position, retry_at, error, seen)
    WHERE p.subscription = $1 AND p.position = a.position AND EXISTS (SELECT 1 FROM fenced)
), firsts AS (
    -- By the aggregate, not by an event the look read: an operator's skip
    -- may have deleted that one meanwhile. The statement's snapshot still
    -- has the events deleted above: the first left is the first not
    -- among them.
    SELECT n.position
    FROM unnest($9::text[], $10::text[]) AS g (aggregatetype, aggregateid)
    CROSS JOIN LATERAL (
        SELECT n.position FROM outbox_event_parked AS n
        WHERE n.subscription = $1 AND n.aggregatetype = g.aggregatetype
          AND n.aggregateid = g.aggregateid AND n.position NOT IN (SELECT unnest($5::bigint[]))
        ORDER BY n.position LIMIT 1) AS n
), promoted AS (
    UPDATE outbox_event_parked AS p SET retry_at = now()
    FROM firsts AS f
    WHERE p.subscription = $1 AND p.position = f.position
      AND f.position NOT IN (SELECT unnest($6::bigint[])) AND EXISTS (SELECT 1 FROM fenced)
)
SELECT 1 FROM fenced
