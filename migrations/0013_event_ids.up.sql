-- Ids of events emitted with outbox::events::emit_once (the CLI's `events
-- emit` among them): a retry of an emit whose commit outcome was unknown,
-- with the same event id, finds its id here and writes nothing. The log
-- itself has no index on id (every index there costs each emit), so the
-- emits that want this guard pay for it alone. Rows older than the event
-- log's maximum age are deleted by maintenance.
CREATE TABLE outbox_event_ids (
    id uuid PRIMARY KEY,
    emitted_at timestamptz NOT NULL DEFAULT statement_timestamp()
);
CREATE INDEX outbox_event_ids_emitted_idx ON outbox_event_ids (emitted_at);
