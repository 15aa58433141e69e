DROP FUNCTION outbox_signal(bigint, text, jsonb);
