ALTER TABLE outbox_leases DROP COLUMN settings;
