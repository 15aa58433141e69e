ALTER TABLE outbox_event_members
    DROP COLUMN failing_since,
    DROP COLUMN failing_why;
