-- Creates subscription $1 of stream $2 with $3 partitions unless it exists,
-- its cursors at the start of what the log keeps ($4 false) or at its head
-- ($4 true: only events emitted from now on); returns the subscription's
-- stream and partitions as recorded (it keeps what it was created with).
-- At the head, events of transactions still open are not published (they
-- were emitted before); the head is read under the sequence's lock (see
-- event_last_position.sql). Two creators at once: the second gets no row (its
-- snapshot predates the first's commit) and asks again.
WITH created AS (
    INSERT INTO outbox_event_subscriptions (name, stream, partitions)
    VALUES ($1, $2, $3)
    ON CONFLICT (name) DO NOTHING
    RETURNING name, stream, partitions
), cursors AS (
    INSERT INTO outbox_event_cursors (subscription, part, position)
    SELECT c.name, p,
           CASE WHEN $4 THEN coalesce(pg_sequence_last_value('outbox_event_position_seq'), 0)
                ELSE 0 END
    FROM created AS c, generate_series(0, c.partitions - 1) AS p
)
SELECT stream, partitions FROM created
UNION ALL
SELECT stream, partitions FROM outbox_event_subscriptions
WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM created)
