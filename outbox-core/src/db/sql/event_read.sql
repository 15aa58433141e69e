-- The next batch of one partition ($6 of $5) of a subscription of stream
-- $4, whose cursor is at position $1 with gaps $3: it has published its
-- events at or below $1 except those at the gaps, which were not visible
-- when it passed them.
--
-- $2 is the batch's end, at most the sequence's last value as read by the
-- statement before this one, and at most the batch size past $1 unless the
-- positions up to it are settled (see `Settled` in event_log.rs). Every
-- position up to $2 was therefore drawn before this statement's snapshot
-- was taken, by a transaction that already had its id (the log's xid
-- column comes before its position), so below the next transaction id as
-- of now: a position up to $2 that is not visible here belongs to a
-- transaction below that id that is still open or rolled back. The caller
-- keeps those as gaps, with that id as their bound. (A snapshot's xmax is
-- no such bound: it is one past the newest *completed* transaction. The
-- next id is read through age(), which measures from it: GetStable-
-- LatestTransactionId, in a statement of a transaction without an id.)
--
-- Returns the first $7 visible events in ($1, $2] (the caller cuts the
-- batch at the last of them when there are $7) and every visible event at
-- a gap, of any stream or partition (the caller needs all their positions
-- to know the gaps), with the columns only for the partition's own; and
-- the snapshot's xmin and the next transaction id on every row, or on one
-- row alone when nothing is visible.
--
-- A partition is a share of the aggregates' hashes (the same hash as
-- their emit lock's key), computed here rather than stored: a stored
-- column would cost every emit.
--
-- Order: an aggregate's emitters draw positions in their commit order, so
-- when an event is visible, every earlier event of its aggregate is too,
-- at a lower position: it is in this batch or an earlier one, never a
-- later one. Nothing here updates the log.
WITH snap AS MATERIALIZED (
    SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin
), cut AS MATERIALIZED (
    SELECT xmin, xmin + age((xmin % 4294967296)::text::xid) AS next_xid FROM snap
), e AS (
    (SELECT *, hashtext(aggregatetype::text || '/' || aggregateid::text) AS aggregate_hash
     FROM outbox_event_log
     WHERE position > $1 AND position <= $2
     ORDER BY position
     LIMIT $7)
    UNION ALL
    SELECT *, hashtext(aggregatetype::text || '/' || aggregateid::text) AS aggregate_hash
    FROM outbox_event_log
    WHERE position = ANY ($3::bigint[])
), m AS (
    SELECT e.*, e.stream = $4 AND (e.aggregate_hash & 2147483647) % $5 = $6 AS mine FROM e
)
SELECT cut.xmin, cut.next_xid, e.position, e.mine,
       CASE WHEN e.mine THEN e.id::text END AS id,
       CASE WHEN e.mine THEN e.aggregatetype::text END AS aggregatetype,
       CASE WHEN e.mine THEN e.aggregateid::text END AS aggregateid,
       CASE WHEN e.mine THEN e.type::text END AS type,
       CASE WHEN e.mine THEN e.payload::text END AS payload,
       CASE WHEN e.mine THEN e.headers END AS headers,
       e.publish_at, e.created_at, e.aggregate_hash
FROM cut
LEFT JOIN m AS e ON true
ORDER BY e.position
