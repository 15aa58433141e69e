DROP TABLE IF EXISTS outbox_periodic;
