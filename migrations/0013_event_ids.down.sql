DROP TABLE outbox_event_ids;
