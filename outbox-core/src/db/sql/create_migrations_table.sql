-- The record of applied migrations; created by the first migrate call.
CREATE TABLE IF NOT EXISTS outbox_migrations (
    version    bigint PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
