SELECT version, checksum FROM outbox_migrations ORDER BY version
