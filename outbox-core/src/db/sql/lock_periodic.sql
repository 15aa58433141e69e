-- The first statement of `periodic delete` (delete_periodic.sql is the
-- second, in the same transaction): locks periodic task $1's record, which
-- a leader holds while it enqueues the task's ticks, in a statement of its
-- own, so that the delete's snapshot, taken after, sees the ticks a leader
-- committed while this one waited (one statement for both took back none
-- of them).
SELECT name FROM outbox_periodic WHERE name = $1 FOR UPDATE
