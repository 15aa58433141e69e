-- Member $2 of subscription $1 says it is alive for $3 microseconds more
-- (on the database's clock); members silent for a minute are forgotten.
-- Returns how many members are alive, this one included: partitions are
-- shared out among them.
WITH seen AS (
    INSERT INTO outbox_event_members (subscription, member, seen_until)
    VALUES ($1, $2, now() + $3 * interval '1 microsecond')
    ON CONFLICT (subscription, member) DO UPDATE SET seen_until = excluded.seen_until
), gone AS (
    DELETE FROM outbox_event_members
    WHERE subscription = $1 AND seen_until < now() - interval '1 minute'
)
SELECT 1 + count(*) FROM outbox_event_members
WHERE subscription = $1 AND member <> $2 AND seen_until > now()
