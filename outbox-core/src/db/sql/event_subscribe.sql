-- Creates subscription $1 of stream $2 with $3 partitions unless it exists,
-- its cursors where $4 says: 'start' (the start of what the log keeps),
-- 'head' (only events emitted from now on), 'position' (the event at
-- position $5 and every later one; at the head at most) or 'time' (every
-- event emitted at or after $6: the cursor goes after the last visible
-- event emitted before it, so that an emit at or after $6 whose
-- transaction is still open is ahead of the cursor, not skipped; an event
-- emitted just before $6 by a transaction still open then comes too).
-- Returns the subscription's stream and partitions as
-- recorded (it keeps what it was created with), where its cursors
-- start when this statement created it, and the kind of sink recorded
-- ($7, migration 52: written on creation, and on an older subscription
-- that has none yet).
-- A cursor at the head, or at any position, leaves behind it the events
-- of transactions still open below it (they were emitted before); the
-- head is read under the sequence's lock (see event_last_position.sql).
-- Two creators at once: the second gets no row (its snapshot predates
-- the first's commit) and asks again.
WITH created AS (
    INSERT INTO outbox_event_subscriptions (name, stream, partitions, sink)
    VALUES ($1, $2, $3, $7)
    ON CONFLICT (name) DO NOTHING
    RETURNING name, stream, partitions, sink
), recorded AS (
    UPDATE outbox_event_subscriptions
    SET sink = $7
    WHERE name = $1 AND sink IS NULL AND NOT EXISTS (SELECT 1 FROM created)
    RETURNING name
), head AS (
    SELECT coalesce(pg_sequence_last_value('outbox_event_position_seq'), 0) AS position
), start AS (
    SELECT CASE $4::text
               WHEN 'head' THEN h.position
               WHEN 'position' THEN least(greatest($5::bigint - 1, 0), h.position)
               -- Read only when creating: the position index of the
               -- days up to $6, from their ends.
               WHEN 'time' THEN coalesce((SELECT max(e.position) FROM outbox_event_log AS e
                                         WHERE e.created_at < $6::timestamptz
                                           AND EXISTS (SELECT 1 FROM created)),
                                        0)
               ELSE 0
           END AS position
    FROM head AS h
), cursors AS (
    INSERT INTO outbox_event_cursors (subscription, part, position)
    SELECT c.name, p, s.position
    FROM created AS c, start AS s, generate_series(0, c.partitions - 1) AS p
)
SELECT c.stream, c.partitions, s.position AS start, c.sink FROM created AS c, start AS s
UNION ALL
SELECT stream, partitions, NULL,
       CASE WHEN EXISTS (SELECT 1 FROM recorded) THEN $7 ELSE sink END
FROM outbox_event_subscriptions
WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM created)
