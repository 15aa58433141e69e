-- Member $2 of subscription $1 says it is alive for $3 microseconds more
-- (on the database's clock), and that its publishes have failed for $4
-- microseconds, the last time for reason $5 (both null while they
-- succeed; migration 39); members silent for a minute are forgotten.
-- Returns how many members are alive, this one included: partitions are
-- shared out among them.
WITH seen AS (
    INSERT INTO outbox_event_members (subscription, member, seen_until, failing_since, failing_why)
    VALUES ($1, $2, now() + $3 * interval '1 microsecond',
            now() - $4 * interval '1 microsecond', $5)
    ON CONFLICT (subscription, member) DO UPDATE
    SET seen_until = excluded.seen_until, failing_since = excluded.failing_since,
        failing_why = excluded.failing_why
), gone AS (
    DELETE FROM outbox_event_members
    WHERE subscription = $1 AND seen_until < now() - interval '1 minute'
)
SELECT 1 + count(*) FROM outbox_event_members
WHERE subscription = $1 AND member <> $2 AND seen_until > now()
