-- The kind of sink a subscription publishes to (nats, kafka, rabbitmq,
-- redis, webhook, or a custom sink's own), recorded by its first relay
-- (found by a new user's walkthrough: a second relay of the same name and
-- another kind of sink, deployed by mistake, took the subscription over,
-- and its events went to the wrong broker with nothing said). A relay of
-- another kind is refused as one naming another stream is. Null for a
-- subscription made before: its next relay records its kind.
ALTER TABLE outbox_event_subscriptions ADD COLUMN sink text;
