-- Back to migration 22: outcomes lock their keys and wait.
DROP FUNCTION outbox_keys_try_lock(text[], text[], interval);
