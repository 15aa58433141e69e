-- A task with an ordering key must be submitted at READ COMMITTED (the
-- default). The insert trigger takes the key's lock and then looks for
-- earlier unfinished tasks of the key; at REPEATABLE READ or SERIALIZABLE
-- that look uses the transaction's first snapshot, which may predate a
-- task of the same key committed meanwhile, and the new task would run
-- beside it instead of after it. Refuse such a submit with a clear error
-- rather than break the order silently.
CREATE OR REPLACE FUNCTION outbox_key_on_insert() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'a task with an ordering key (%) cannot be submitted in a % transaction',
                        NEW.ordering_key, current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'submit keyed tasks at READ COMMITTED (the default): the key''s order '
                         'depends on seeing every task of the key committed before the submit';
    END IF;
    PERFORM outbox_lock_key(NEW.queue, NEW.ordering_key);
    NEW.key_seq := nextval('outbox_key_seq');
    NEW.blocked := outbox_key_full(NEW.queue, NEW.ordering_key, NULL);
    RETURN NEW;
END
$$;
