-- Holds events back for subscription $1 (a parked aggregate's events), if
-- holder $3 still holds partition $2 under fence $4. $16 is when the relay
-- tries each again (null: when an operator says so), $17 the error. Only
-- an aggregate's first held-back event keeps its time: one behind an
-- earlier event of its aggregate, held back already or given here, waits
-- for that one and has none (see migration 37).
INSERT INTO outbox_event_parked (subscription, position, id, aggregatetype, aggregateid, type,
                                 payload, headers, publish_at, aggregate_hash, created_at,
                                 retry_at, error)
SELECT $1, u.position, u.id, u.aggregatetype, u.aggregateid, u.type, u.payload::jsonb, u.headers,
       u.publish_at, u.aggregate_hash, u.created_at,
       CASE WHEN u.nth > 1 OR EXISTS (
                SELECT 1 FROM outbox_event_parked AS q
                WHERE q.subscription = $1 AND q.aggregatetype = u.aggregatetype
                  AND q.aggregateid = u.aggregateid AND q.position < u.position)
            THEN NULL ELSE u.retry_at END,
       u.error
FROM (SELECT v.*, row_number() OVER (PARTITION BY v.aggregatetype, v.aggregateid
                                     ORDER BY v.position) AS nth
      FROM unnest($5::bigint[], $6::uuid[], $7::text[], $8::text[], $9::text[], $10::text[],
                  $11::jsonb[], $12::timestamptz[], $13::integer[], $14::timestamptz[],
                  $15::timestamptz[], $16::text[])
           AS v(position, id, aggregatetype, aggregateid, type, payload, headers, publish_at,
                aggregate_hash, created_at, retry_at, error)) AS u
WHERE EXISTS (SELECT 1 FROM outbox_event_cursors
              WHERE subscription = $1 AND part = $2 AND holder = $3 AND fence = $4)
ON CONFLICT (subscription, position) DO NOTHING
