-- An operator moves subscription $1's cursors, every partition's, to where
-- $2 says, as event_subscribe.sql places a new subscription's: 'start',
-- 'head', 'position' (after $3 - 1, at the head at most) or 'time' (after
-- the last event emitted before $4). Each partition gets a new fence: a
-- relay worker holding it writes nothing more (its renewal and its cursor
-- writes name the old fence), and it or another takes it again from the
-- new cursor once the old lease has run out. Holder and lease stay
-- because the old holder may still be publishing from the old cursor until
-- then (it learns of the rewind at its next renewal): an aggregate's
-- events from the new cursor must not go out beside them. (A holder kept,
-- not cleared, also keeps out a relay of a build before this rule, whose
-- acquire takes any partition without a holder.) The gaps at or below the new position stay (transactions
-- still open there are still waited for); those above it go, and so do
-- the held-back events above it, which are read again. Returns the new
-- position, or no row when there is no such subscription.
WITH head AS (
    SELECT coalesce(pg_sequence_last_value('outbox_event_position_seq'), 0) AS position
), target AS (
    SELECT CASE $2::text
               WHEN 'head' THEN h.position
               WHEN 'position' THEN least(greatest($3::bigint - 1, 0), h.position)
               WHEN 'time' THEN coalesce((SELECT max(e.position) FROM outbox_event_log AS e
                                         WHERE e.created_at < $4::timestamptz), 0)
               ELSE 0
           END AS position
    FROM head AS h
), moved AS (
    UPDATE outbox_event_cursors AS c
    SET position = t.position,
        (gaps, gap_bounds) = (
            SELECT coalesce(array_agg(g.gap ORDER BY g.gap), '{}'),
                   coalesce(array_agg(g.bound ORDER BY g.gap), '{}')
            FROM unnest(c.gaps, c.gap_bounds) AS g (gap, bound)
            WHERE g.gap <= t.position),
        fence = c.fence + 1,
        advanced_at = now()
    FROM target AS t
    WHERE c.subscription = $1
    RETURNING c.part
), dropped AS (
    DELETE FROM outbox_event_parked AS p
    USING target AS t
    WHERE p.subscription = $1 AND p.position > t.position
)
SELECT t.position FROM target AS t WHERE EXISTS (SELECT 1 FROM moved)
