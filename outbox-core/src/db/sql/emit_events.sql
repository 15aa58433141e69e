-- Appends several events to the log in one statement (outbox::emit_all).
-- Every aggregate's advisory lock is taken first, in order of their hashes
-- (so emitters of the same aggregates never deadlock on each other), then
-- the events are inserted in the order given, each drawing its position.
-- See emit_event.sql for the lock.
WITH e AS MATERIALIZED (
    SELECT *
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::jsonb[],
                $7::text[], $8::timestamptz[], $9::boolean[])
         WITH ORDINALITY AS e(id, aggregatetype, aggregateid, type, payload, headers, stream,
                              publish_at, ordered, n)
), x AS MATERIALIZED (
    -- The transaction's id before the positions: see the log's xid column.
    SELECT pg_current_xact_id() AS xid
), locks AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(1869574002, h)
    FROM (SELECT DISTINCT hashtext(aggregatetype || '/' || aggregateid) AS h
          FROM e WHERE ordered ORDER BY 1) AS s
)
INSERT INTO outbox_event_log (xid, id, aggregatetype, aggregateid, type, payload, headers, stream, publish_at)
SELECT x.xid, id, aggregatetype, aggregateid, type, payload, headers, stream, publish_at
FROM e, x, (SELECT count(*) FROM locks) AS locked
ORDER BY n
RETURNING position
