-- What each live relay worker last said of its broker, with its word of
-- being alive: since when its publishes have failed for now (transient
-- failures with no success since: a broker down, timing out, answering
-- 5xx) and the last reason; null while they succeed. `events
-- subscriptions` and the dashboard show it, so an outage is seen where
-- the lag is, not only in the worker's log and metrics.
ALTER TABLE outbox_event_members
    ADD COLUMN failing_since timestamptz,
    ADD COLUMN failing_why text;
