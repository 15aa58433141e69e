SELECT to_regclass('outbox_migrations') IS NOT NULL
