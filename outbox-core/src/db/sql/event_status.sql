-- The event at position $1, or else the one with id $2 emitted between $3
-- and $4 (the log has no index on id: the window keeps the search to a
-- few days' partitions); and for each subscription reading its stream,
-- where it stands there: 'held back' (a parked aggregate's event, with
-- the error and when it is tried again), 'passed' (at or below its
-- partition's cursor and not one of its gaps: published, or passed over
-- by a skip, a rewind or the subscription's start) or 'waiting'. One row
-- per subscription, or one with no subscription when none reads it.
-- Two arms, not one OR: the id's arm must prune the log's partitions by
-- the window (at the executor's start, whatever the plan), which a
-- condition ORed with the position's would not let it.
WITH e AS (
    (SELECT l.* FROM outbox_event_log AS l WHERE l.position = $1::bigint)
    UNION ALL
    (SELECT l.* FROM outbox_event_log AS l
     WHERE $1::bigint IS NULL AND l.id = $2::uuid
       AND l.created_at >= $3::timestamptz AND l.created_at < $4::timestamptz)
    LIMIT 1
)
SELECT e.position, e.id::text AS id, e.aggregatetype::text AS aggregatetype,
       e.aggregateid::text AS aggregateid, e.type::text AS type, e.payload,
       e.headers, e.stream, e.created_at, e.publish_at,
       s.name AS subscription,
       CASE WHEN s.name IS NULL THEN NULL
            WHEN p.position IS NOT NULL THEN 'held back'
            WHEN c.position >= e.position AND NOT (e.position = ANY (c.gaps)) THEN 'passed'
            ELSE 'waiting' END AS state,
       p.error, p.retry_at
FROM e
LEFT JOIN outbox_event_subscriptions AS s ON s.stream = e.stream
LEFT JOIN outbox_event_cursors AS c
       ON c.subscription = s.name
      AND c.part = (hashtext(e.aggregatetype::text || '/' || e.aggregateid::text) & 2147483647)
                   % s.partitions
LEFT JOIN outbox_event_parked AS p ON p.subscription = s.name AND p.position = e.position
ORDER BY s.name
