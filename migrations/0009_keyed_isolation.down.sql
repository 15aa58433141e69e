-- Back to migration 8's trigger function, which accepts any isolation.
CREATE OR REPLACE FUNCTION outbox_key_on_insert() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM outbox_lock_key(NEW.queue, NEW.ordering_key);
    NEW.key_seq := nextval('outbox_key_seq');
    NEW.blocked := outbox_key_full(NEW.queue, NEW.ordering_key, NULL);
    RETURN NEW;
END
$$;
