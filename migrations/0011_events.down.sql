DROP TRIGGER IF EXISTS outbox_events_mirror ON outbox_tasks;
DROP FUNCTION outbox_events_mirror();
DROP TABLE outbox_events;
DROP TABLE outbox_inbox;
DROP FUNCTION outbox_event_id(bigint);
DROP TABLE outbox_instance;
