-- Deletes subscription $1 with its cursors, members and held-back events,
-- unless a relay worker is on it: a member whose word has not run out, or
-- a partition whose lease has not. A live relay would create it again and
-- publish the log from where a new subscription starts. Returns whether
-- a relay is on it, and how many events it held back (gone with it when
-- it was deleted). No row: no such subscription. The row lock orders this against a member's word (whose
-- row refers to the subscription's).
WITH s AS (
    SELECT t.name,
           EXISTS (SELECT 1 FROM outbox_event_members AS m
                   WHERE m.subscription = t.name AND m.seen_until > now())
           OR EXISTS (SELECT 1 FROM outbox_event_cursors AS c
                      WHERE c.subscription = t.name AND c.lease_until > now()) AS live,
           (SELECT count(*) FROM outbox_event_parked AS p
            WHERE p.subscription = t.name) AS held_back
    FROM outbox_event_subscriptions AS t
    WHERE t.name = $1
    FOR UPDATE
), gone AS (
    DELETE FROM outbox_event_subscriptions AS t
    USING s
    WHERE t.name = s.name AND NOT s.live
    RETURNING t.name
)
SELECT s.live, s.held_back FROM s
