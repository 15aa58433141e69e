DROP TABLE IF EXISTS outbox_leases;
