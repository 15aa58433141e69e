-- Reverts to events as tasks. Events still in the log are not moved back:
-- drain the relays before going down.
DROP FUNCTION outbox_event_log_drop(timestamptz, timestamptz);
DROP FUNCTION outbox_event_log_cover(timestamptz, interval);
DROP FUNCTION outbox_event_log_partitions();
DROP TABLE outbox_event_parked;
DROP TABLE outbox_event_members;
DROP TABLE outbox_event_cursors;
DROP TABLE outbox_event_subscriptions;
DROP TABLE outbox_event_log;
DROP SEQUENCE outbox_event_position_seq;

CREATE TABLE outbox_events (
    id            uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    headers       jsonb,
    task_id       bigint NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_events_created_idx ON outbox_events (created_at);

CREATE FUNCTION outbox_events_mirror() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_events (id, aggregatetype, aggregateid, type, payload, headers, task_id)
    VALUES (coalesce((NEW.payload->>'id')::uuid, outbox_event_id(NEW.id)),
            NEW.payload->>'aggregate_type', NEW.payload->>'aggregate_id',
            NEW.payload->>'type', NEW.payload->'payload', NEW.payload->'headers', NEW.id);
    RETURN NULL;
END
$$;
