-- The aggregates of partition $3 (of $2) that subscription $1 holds back,
-- read whole when a relay takes the partition and now and then after
-- (the sweep). It puts right what a race with an operator may have left
-- (see migration 37): a first event with neither a time nor an error is
-- due now, and a later one keeps no time. Neither write is fenced: both
-- only restore what every writer keeps true.
WITH firsts AS (
    SELECT DISTINCT ON (aggregatetype, aggregateid)
           aggregatetype, aggregateid, position, retry_at, error
    FROM outbox_event_parked
    WHERE subscription = $1 AND (aggregate_hash & 2147483647) % $2 = $3
    ORDER BY aggregatetype, aggregateid, position
), lost AS (
    UPDATE outbox_event_parked AS p SET retry_at = now()
    FROM firsts AS f
    WHERE p.subscription = $1 AND p.position = f.position
      AND f.retry_at IS NULL AND f.error IS NULL
), timed AS (
    -- Through the due index, each checked by the aggregate's.
    UPDATE outbox_event_parked AS p SET retry_at = NULL
    WHERE p.subscription = $1 AND p.retry_at IS NOT NULL
      AND (p.aggregate_hash & 2147483647) % $2 = $3
      AND p.position > (SELECT min(q.position) FROM outbox_event_parked AS q
                        WHERE q.subscription = $1 AND q.aggregatetype = p.aggregatetype
                          AND q.aggregateid = p.aggregateid)
)
SELECT aggregatetype::text, aggregateid::text FROM firsts
