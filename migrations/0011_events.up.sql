-- outbox: events. An event is a task of type 'outbox.event' (outbox::emit),
-- ordered per aggregate by its ordering key; a relay publishes it to a
-- broker. These tables give events their ids, give consumers their inbox,
-- and give Debezium the layout it reads.

-- One row: this database's instance id. An event whose emitter gave no id
-- gets one derived from this and its task id (outbox_event_id), so ids stay
-- unique across databases whose task ids overlap (a restored copy, a
-- second region).
CREATE TABLE outbox_instance (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- md5 of randomness rather than gen_random_uuid(), which PostgreSQL 12
    -- lacks without pgcrypto.
    id         uuid NOT NULL DEFAULT md5(random()::text || clock_timestamp()::text)::uuid,
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO outbox_instance DEFAULT VALUES;

-- The derived event id: a version-8 UUID of the instance id's first eight
-- bytes (version nibble set) and the task id's eight (variant bits set; ids
-- stay below 2^62). The relay computes the same in Rust.
CREATE FUNCTION outbox_event_id(task_id bigint) RETURNS uuid
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (substr(h, 1, 12) || '8' || substr(h, 14, 3)
            || to_hex((task_id & 4611686018427387903) | -9223372036854775808))::uuid
    FROM (SELECT replace(id::text, '-', '') AS h FROM outbox_instance) AS i
$$;

-- The receiving side's record of events it has processed (outbox::inbox):
-- written in the consumer's own transaction, so a redelivered event is
-- recognised exactly when its effects committed. The maintenance leader
-- deletes rows older than the completed-task retention.
CREATE TABLE outbox_inbox (
    consumer     text NOT NULL,
    event_id     text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX outbox_inbox_processed_idx ON outbox_inbox (processed_at);

-- The layout Debezium's Outbox Event Router reads by default (id,
-- aggregatetype, aggregateid, type, payload), filled only while the mirror
-- is on (`outbox-worker events debezium on`): a trigger copies each event
-- as its task is inserted, in the same transaction.
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
