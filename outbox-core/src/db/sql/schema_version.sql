-- The applied schema version (only once outbox_migrations exists).
SELECT coalesce(max(version), 0) FROM outbox_migrations
