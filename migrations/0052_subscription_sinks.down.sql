ALTER TABLE outbox_event_subscriptions DROP COLUMN sink;
