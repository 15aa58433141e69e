INSERT INTO outbox_migrations (version, name, checksum) VALUES ($1, $2, $3)
