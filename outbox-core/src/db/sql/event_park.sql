-- Holds events back for subscription $1 (a parked aggregate's events), if
-- holder $3 still holds partition $2 under fence $4. $16 is when the relay
-- tries each again (null: when an operator says so), $17 the error.
INSERT INTO outbox_event_parked (subscription, position, id, aggregatetype, aggregateid, type,
                                 payload, headers, publish_at, aggregate_hash, created_at,
                                 retry_at, error)
SELECT $1, u.position, u.id, u.aggregatetype, u.aggregateid, u.type, u.payload::jsonb, u.headers,
       u.publish_at, u.aggregate_hash, u.created_at, u.retry_at, u.error
FROM unnest($5::bigint[], $6::uuid[], $7::text[], $8::text[], $9::text[], $10::text[],
            $11::jsonb[], $12::timestamptz[], $13::integer[], $14::timestamptz[],
            $15::timestamptz[], $16::text[])
     AS u(position, id, aggregatetype, aggregateid, type, payload, headers, publish_at,
          aggregate_hash, created_at, retry_at, error)
WHERE EXISTS (SELECT 1 FROM outbox_event_cursors
              WHERE subscription = $1 AND part = $2 AND holder = $3 AND fence = $4)
ON CONFLICT (subscription, position) DO NOTHING
