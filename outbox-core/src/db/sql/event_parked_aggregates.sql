-- The aggregates of partition $3 (of $2) that subscription $1 holds back,
-- read whole when a relay takes the partition and now and then after
-- (the sweep), in one pass over the list. It puts right what a race may
-- have left (see migration 37): a first event with neither a time nor an
-- error is due now, and a later one keeps no time. Neither write is
-- fenced: both only restore what every writer keeps true, and each
-- checks its row again if another session changed it meanwhile.
WITH held AS MATERIALIZED (
    SELECT aggregatetype, aggregateid, position, retry_at, error,
           row_number() OVER (PARTITION BY aggregatetype, aggregateid ORDER BY position) AS nth
    FROM outbox_event_parked
    WHERE subscription = $1 AND (aggregate_hash & 2147483647) % $2 = $3
), lost AS (
    UPDATE outbox_event_parked AS p SET retry_at = now()
    FROM held AS h
    WHERE p.subscription = $1 AND p.position = h.position
      AND h.nth = 1 AND h.retry_at IS NULL AND h.error IS NULL
      AND p.retry_at IS NULL AND p.error IS NULL
), timed AS (
    UPDATE outbox_event_parked AS p SET retry_at = NULL
    FROM held AS h
    WHERE p.subscription = $1 AND p.position = h.position
      AND h.nth > 1 AND h.retry_at IS NOT NULL
      -- Checked again if changed meanwhile: a skip that made it first
      -- gave it a time of its own.
      AND p.retry_at = h.retry_at
)
SELECT aggregatetype::text, aggregateid::text FROM held WHERE nth = 1
