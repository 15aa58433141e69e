-- outbox: submit tasks and emit events from SQL.
--
-- outbox_submit and outbox_emit let a trigger, a migration, psql or a
-- service written in another language write a task or an event in its own
-- transaction, with what the Rust API gives: the task type's declared
-- queue, priority, attempts and uniqueness, ordering keys, delays, a NOTIFY
-- at commit, the aggregate's commit order and emit-once ids. Bad input is
-- refused with SQLSTATE 22023 (invalid_parameter_value) and a message that
-- names the field, before anything is written.

-- What each task type declares in the code that handles it: written by
-- every worker at start for the types registered in its binary
-- (#[outbox_task]), read by outbox_submit. Two binaries that declare one
-- type differently overwrite each other: the last worker started wins.
CREATE TABLE outbox_task_types (
    task_type        text PRIMARY KEY,
    queue            text NOT NULL,
    priority         smallint NOT NULL,
    max_attempts     int NOT NULL,
    skip_dead        boolean NOT NULL,
    -- `unique_by`: the payload fields whose values (a JSON array, as the
    -- Rust side writes it) make the unique key; null when not unique.
    unique_fields    text[],
    unique_period_us bigint,
    unique_states    smallint,
    -- `ordering_key`: the payload field whose value is the ordering key.
    ordering_field   text,
    -- Whether those fields read the same from JSON as from Rust (integers,
    -- text and booleans under their own names). If not, a submit from SQL
    -- must give the keys itself.
    keys_from_payload boolean NOT NULL DEFAULT true,
    registered_at    timestamptz NOT NULL DEFAULT now()
);

-- Raises invalid_parameter_value with `message`: every refusal below.
CREATE FUNCTION outbox_refuse(message text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION '%', message USING ERRCODE = 'invalid_parameter_value';
END
$$;

-- A delay given as JSON: a number of seconds or an interval's text
-- ('5 minutes'), from 0 to `most`.
CREATE FUNCTION outbox_json_delay(what text, value jsonb, most interval) RETURNS interval
LANGUAGE plpgsql
AS $$
DECLARE
    d interval;
BEGIN
    IF jsonb_typeof(value) = 'number' THEN
        IF (value #>> '{}')::numeric > extract(epoch FROM most) THEN
            PERFORM outbox_refuse(format('%s %s is too long: the most is %s', what, value, most));
        END IF;
        BEGIN
            d := (value #>> '{}')::float8 * interval '1 second';
        EXCEPTION WHEN numeric_value_out_of_range THEN
            d := interval '0';
        END;
    ELSIF jsonb_typeof(value) = 'string' THEN
        BEGIN
            d := (value #>> '{}')::interval;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
            PERFORM outbox_refuse(format('%s %s is not an interval (use seconds or text such as ''5 minutes'')', what, value));
        END;
    ELSE
        PERFORM outbox_refuse(format('%s must be a number of seconds or an interval''s text, not %s', what, value));
    END IF;
    -- Compared as instants: '12 months' is not 360 days.
    IF now() + d < now() OR now() + d > now() + most THEN
        PERFORM outbox_refuse(format('%s %s is out of range: use 0 to %s', what, value, most));
    END IF;
    RETURN d;
END
$$;

-- Refuses any key of `options` not in `known`: a misspelt option must not
-- be dropped without a word.
CREATE FUNCTION outbox_check_options(fn text, options jsonb, known text[]) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    unknown text;
BEGIN
    IF jsonb_typeof(options) IS DISTINCT FROM 'object' THEN
        PERFORM outbox_refuse(format('%s: options must be a JSON object, not %s', fn, options));
    END IF;
    SELECT string_agg(quote_literal(k), ', ' ORDER BY k) INTO unknown
    FROM jsonb_object_keys(options) AS k
    WHERE k <> ALL (known);
    IF unknown IS NOT NULL THEN
        PERFORM outbox_refuse(format('%s: unknown option %s (known: %s)',
                                     fn, unknown, array_to_string(known, ', ')));
    END IF;
END
$$;

-- Option `name`'s text, refusing anything but a JSON string.
CREATE FUNCTION outbox_option_text(fn text, options jsonb, name text) RETURNS text
LANGUAGE plpgsql
AS $$
BEGIN
    IF options ? name AND jsonb_typeof(options -> name) <> 'string' THEN
        PERFORM outbox_refuse(format('%s: option %s must be text, not %s', fn, name, options -> name));
    END IF;
    RETURN options ->> name;
END
$$;

-- A payload field's value as the Rust side renders it: text as is,
-- numbers and booleans as written.
CREATE FUNCTION outbox_field_text(fn text, payload jsonb, field text, what text) RETURNS text
LANGUAGE plpgsql
AS $$
BEGIN
    IF coalesce(jsonb_typeof(payload -> field), 'missing') NOT IN ('string', 'number', 'boolean') THEN
        PERFORM outbox_refuse(format(
            '%s: the task type takes its %s from payload field %s, which is %s: give a string, number or boolean there, or the option explicitly',
            fn, what, quote_literal(field), coalesce(jsonb_typeof(payload -> field), 'missing')));
    END IF;
    RETURN payload ->> field;
END
$$;

-- Submits a task in the caller's transaction and returns its id (for a
-- duplicate unique task, the id of the task that holds the key). Options
-- (all optional): queue, priority (0-9), delay (seconds or interval text)
-- or run_at (timestamptz text), ordering_key, unique_key, unique_period
-- (seconds or interval text), unique_including (["completed", "dead"]),
-- notify (false: no NOTIFY at commit for a task due at once).
-- Without them the type's declaration (outbox_task_types) applies; a type
-- no worker has declared needs options.queue.
CREATE FUNCTION outbox_submit(task_type text, payload jsonb, options jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    fn constant text := 'outbox_submit';
    decl outbox_task_types%ROWTYPE;
    q text;
    prio smallint;
    due timestamptz := now();
    okey text;
    ukey text;
    ustates smallint;
    uperiod_us bigint;
    including text;
    new_id bigint;
BEGIN
    -- An option given as JSON null counts as not given.
    options := jsonb_strip_nulls(coalesce(options, '{}'));
    PERFORM outbox_check_options(fn, options, ARRAY['queue', 'priority', 'delay', 'run_at',
        'ordering_key', 'unique_key', 'unique_period', 'unique_including', 'notify']);
    IF options ? 'notify' AND jsonb_typeof(options -> 'notify') <> 'boolean' THEN
        PERFORM outbox_refuse(format('%s: option notify must be true or false, not %s',
                                     fn, options -> 'notify'));
    END IF;
    IF task_type IS NULL OR task_type = '' THEN
        PERFORM outbox_refuse(fn || ': the task type is empty');
    END IF;
    -- The rule #[outbox_task] applies to task_type.
    IF task_type !~ '^[A-Za-z0-9_.:-]{1,128}$' THEN
        PERFORM outbox_refuse(format('%s: task type %s is invalid: use 1 to 128 ASCII letters, digits or _-.:',
                                     fn, quote_literal(task_type)));
    END IF;
    IF payload IS NULL THEN
        PERFORM outbox_refuse(fn || ': the payload is null (give ''{}''::jsonb for none)');
    END IF;
    SELECT * INTO decl FROM outbox_task_types t WHERE t.task_type = outbox_submit.task_type;
    IF NOT FOUND AND NOT options ? 'queue' THEN
        PERFORM outbox_refuse(format(
            '%s: unknown task type %s: no worker has declared it (start a worker that handles it, or give options.queue)',
            fn, quote_literal(task_type)));
    END IF;

    q := coalesce(outbox_option_text(fn, options, 'queue'), decl.queue);
    IF q IS NULL OR q !~ '^[A-Za-z0-9_.:-]{1,128}$' THEN
        PERFORM outbox_refuse(format('%s: queue name %s is invalid: use 1 to 128 ASCII letters, digits or _-.:',
                                     fn, quote_literal(q)));
    END IF;

    IF options ? 'priority' THEN
        IF jsonb_typeof(options -> 'priority') <> 'number'
           OR (options ->> 'priority')::numeric NOT IN (0, 1, 2, 3, 4, 5, 6, 7, 8, 9) THEN
            PERFORM outbox_refuse(format('%s: priority %s is out of range: use 0 (first) to 9 (last)',
                                         fn, options -> 'priority'));
        END IF;
        prio := (options ->> 'priority')::smallint;
    ELSE
        prio := coalesce(decl.priority, 0);
    END IF;

    IF options ? 'delay' AND options ? 'run_at' THEN
        PERFORM outbox_refuse(fn || ': give delay or run_at, not both');
    ELSIF options ? 'delay' THEN
        due := now() + outbox_json_delay(fn || ': delay', options -> 'delay', interval '36500 days');
    ELSIF options ? 'run_at' THEN
        BEGIN
            due := outbox_option_text(fn, options, 'run_at')::timestamptz;
        EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow THEN
            PERFORM outbox_refuse(format('%s: run_at %s is not a timestamp', fn, options -> 'run_at'));
        END;
        IF NOT isfinite(due) OR due > now() + interval '36500 days' THEN
            PERFORM outbox_refuse(format('%s: run_at %s is out of range', fn, options -> 'run_at'));
        END IF;
    END IF;

    IF options ? 'ordering_key' THEN
        okey := outbox_option_text(fn, options, 'ordering_key');
    ELSIF decl.ordering_field IS NOT NULL THEN
        IF NOT decl.keys_from_payload THEN
            PERFORM outbox_refuse(format(
                '%s: task type %s takes its ordering key from field %s, whose JSON form is not its Rust form (a float, an enum, a renamed field...): give options.ordering_key',
                fn, quote_literal(task_type), quote_literal(decl.ordering_field)));
        END IF;
        okey := outbox_field_text(fn, payload, decl.ordering_field, 'ordering key');
    END IF;
    IF okey IS NOT NULL AND (octet_length(okey) NOT BETWEEN 1 AND 512) THEN
        PERFORM outbox_refuse(format('%s: ordering key of %s bytes is out of range: use 1 to 512 bytes',
                                     fn, octet_length(okey)));
    END IF;

    IF options ? 'unique_key' THEN
        ukey := outbox_option_text(fn, options, 'unique_key');
        ustates := 7;
        FOR including IN SELECT jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(options -> 'unique_including') = 'array'
                 THEN options -> 'unique_including'
                 WHEN options ? 'unique_including'
                 THEN jsonb_build_array(options -> 'unique_including')
                 ELSE '[]' END)
        LOOP
            ustates := ustates | CASE including WHEN 'completed' THEN 8 WHEN 'dead' THEN 16 ELSE 0 END;
            IF including IS NULL OR including NOT IN ('completed', 'dead') THEN
                PERFORM outbox_refuse(format('%s: unique_including takes "completed" and "dead", not %s',
                                             fn, quote_literal(including)));
            END IF;
        END LOOP;
        IF options ? 'unique_period' THEN
            uperiod_us := (extract(epoch FROM outbox_json_delay(fn || ': unique_period',
                               options -> 'unique_period', interval '36500 days')) * 1000000)::bigint;
            IF uperiod_us < 1000000 THEN
                PERFORM outbox_refuse(format('%s: unique_period %s is out of range: use 1 second to 100 years',
                                             fn, options -> 'unique_period'));
            END IF;
        END IF;
    ELSIF options ? 'unique_period' OR options ? 'unique_including' THEN
        PERFORM outbox_refuse(fn || ': unique_period and unique_including need unique_key');
    ELSIF decl.unique_fields IS NOT NULL THEN
        IF NOT decl.keys_from_payload THEN
            PERFORM outbox_refuse(format(
                '%s: task type %s takes its unique key from fields %s, whose JSON form is not their Rust form (a float, an enum, a renamed field...): give options.unique_key',
                fn, quote_literal(task_type), array_to_string(decl.unique_fields, ', ')));
        END IF;
        -- The Rust side's key: serde_json of the tuple of the fields'
        -- values, a compact JSON array, or null for no fields (one task per
        -- type). jsonb writes integers, text and booleans as serde_json
        -- does.
        SELECT CASE WHEN cardinality(decl.unique_fields) = 0 THEN 'null'
                    ELSE '[' || string_agg(CASE WHEN outbox_field_text(fn, payload, f, 'unique key') IS NOT NULL
                                                THEN (payload -> f)::text END,
                                           ',' ORDER BY n) || ']' END
        INTO ukey
        FROM unnest(decl.unique_fields) WITH ORDINALITY AS u(f, n);
        ustates := decl.unique_states;
        uperiod_us := decl.unique_period_us;
    END IF;
    IF ukey IS NOT NULL THEN
        IF octet_length(ukey) > 1024 THEN
            PERFORM outbox_refuse(format('%s: unique key of %s bytes is too long: the most is 1024',
                                         fn, octet_length(ukey)));
        END IF;
        -- As insert_unique_tasks.sql: type, key, and the period's bucket.
        ukey := task_type || ':' || ukey;
        IF uperiod_us IS NOT NULL THEN
            ukey := ukey || ':' || floor(extract(epoch FROM now()) * 1000000 / uperiod_us)::bigint::text;
        END IF;
    END IF;

    -- A key freed between the insert and the look-up is tried again.
    FOR attempt IN 1..5 LOOP
        INSERT INTO outbox_tasks AS t (task_type, queue, payload, priority, max_attempts, execute_at,
                                       unique_key, unique_states, ordering_key, skip_dead)
        VALUES (task_type, q, payload, prio, coalesce(decl.max_attempts, 10), due,
                ukey, ustates, okey, coalesce(decl.skip_dead, false))
        ON CONFLICT (unique_key)
            WHERE unique_key IS NOT NULL
              AND outbox_unique_covers(unique_states, state, dead_at IS NOT NULL)
            DO NOTHING
        RETURNING t.id INTO new_id;
        IF new_id IS NOT NULL THEN
            -- PostgreSQL flushes notifying commits one at a time (see
            -- wakeup.rs), which the Rust side debounces per process; here
            -- the caller may opt out, and workers find the task by polling.
            IF due <= now() AND (options -> 'notify') IS DISTINCT FROM 'false' THEN
                PERFORM pg_notify('outbox_tasks', q);
            END IF;
            RETURN new_id;
        END IF;
        SELECT t.id INTO new_id FROM outbox_tasks t
        WHERE t.unique_key = ukey
          AND t.unique_key IS NOT NULL
          AND outbox_unique_covers(t.unique_states, t.state, t.dead_at IS NOT NULL);
        IF new_id IS NOT NULL THEN
            RETURN new_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION '%: the unique key % kept changing hands during the insert; submit it again', fn, ukey
        USING ERRCODE = 'serialization_failure';
END
$$;

-- A UUIDv7 (milliseconds since the epoch, then randomness), as
-- outbox::events::new_event_id makes.
CREATE FUNCTION outbox_new_event_id() RETURNS uuid
LANGUAGE sql VOLATILE
AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
               PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
               FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$;

-- Emits an event in the caller's transaction, after the aggregate's earlier
-- events in commit order (emit_event.sql), and returns its id and
-- position. Headers: a JSON object of text values, or null. Options (all
-- optional): id (a UUID; without it a new UUIDv7), stream (default
-- 'events'), delay (seconds or interval text), unordered (true: no lock on
-- the aggregate, no order), once (true: skip an id emitted with once
-- before; position is then null and nothing is written).
CREATE FUNCTION outbox_emit(aggregate_type text, aggregate_id text, event_type text, payload jsonb,
                            headers jsonb DEFAULT NULL, options jsonb DEFAULT '{}',
                            OUT id uuid, OUT "position" bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    fn constant text := 'outbox_emit';
    reserved constant text[] := ARRAY['event-id', 'aggregate-type', 'aggregate-id', 'event-type',
                                      'sequence', 'created-at'];
    field record;
    header record;
    stream_name text := 'events';
    publish timestamptz;
BEGIN
    options := jsonb_strip_nulls(coalesce(options, '{}'));
    payload := coalesce(payload, 'null');
    PERFORM outbox_check_options(fn, options, ARRAY['id', 'stream', 'delay', 'unordered', 'once']);
    FOR field IN SELECT * FROM (VALUES ('aggregate type', aggregate_type), ('aggregate id', aggregate_id),
                                       ('event type', event_type)) AS f(what, value)
    LOOP
        IF field.value IS NULL OR octet_length(field.value) NOT BETWEEN 1 AND 255 THEN
            PERFORM outbox_refuse(format('%s: its %s is %s bytes: use 1 to 255',
                                         fn, field.what, coalesce(octet_length(field.value), 0)));
        END IF;
        IF field.value ~ '[[:cntrl:]]' THEN
            PERFORM outbox_refuse(format('%s: its %s %s holds a control character',
                                         fn, field.what, quote_literal(field.value)));
        END IF;
    END LOOP;
    IF strpos(aggregate_type, '/') > 0 THEN
        PERFORM outbox_refuse(format(
            '%s: its aggregate type %s contains ''/'', which separates type and id in the aggregate''s key',
            fn, quote_literal(aggregate_type)));
    END IF;

    IF headers = '{}' OR headers = 'null' THEN
        headers := NULL;
    END IF;
    IF headers IS NOT NULL THEN
        IF jsonb_typeof(headers) <> 'object' THEN
            PERFORM outbox_refuse(format('%s: headers must be a JSON object of text values, not %s', fn, headers));
        END IF;
        IF (SELECT count(*) FROM jsonb_object_keys(headers)) > 64 THEN
            PERFORM outbox_refuse(fn || ': it has more than 64 headers');
        END IF;
        FOR header IN SELECT * FROM jsonb_each(headers) LOOP
            IF header.key !~ '^[A-Za-z0-9._-]{1,255}$' THEN
                PERFORM outbox_refuse(format(
                    '%s: header name %s: use 1 to 255 ASCII letters, digits, ''-'', ''_'' or ''.''',
                    fn, quote_literal(header.key)));
            END IF;
            IF lower(header.key) = ANY (reserved) THEN
                PERFORM outbox_refuse(format('%s: header %s is set by the relay itself (reserved: %s)',
                                             fn, quote_literal(header.key), array_to_string(reserved, ', ')));
            END IF;
            IF jsonb_typeof(header.value) <> 'string' OR octet_length(header.value #>> '{}') > 4096
               OR (header.value #>> '{}') ~ '[[:cntrl:]]' THEN
                PERFORM outbox_refuse(format(
                    '%s: header %s: its value must be text of at most 4096 bytes with no control characters',
                    fn, quote_literal(header.key)));
            END IF;
        END LOOP;
    END IF;

    IF options ? 'id' THEN
        BEGIN
            id := outbox_option_text(fn, options, 'id')::uuid;
        EXCEPTION WHEN invalid_text_representation THEN
            PERFORM outbox_refuse(format('%s: its id %s is not a UUID', fn, options -> 'id'));
        END;
    ELSE
        id := outbox_new_event_id();
    END IF;
    IF options ? 'stream' THEN
        stream_name := outbox_option_text(fn, options, 'stream');
        IF stream_name IS NULL OR octet_length(stream_name) NOT BETWEEN 1 AND 255 OR stream_name ~ '[[:cntrl:]]' THEN
            PERFORM outbox_refuse(format('%s: its stream %s: use 1 to 255 bytes with no control characters',
                                         fn, options -> 'stream'));
        END IF;
    END IF;
    IF options ? 'delay' THEN
        publish := clock_timestamp() + outbox_json_delay(fn || ': delay', options -> 'delay', interval '365 days');
    END IF;
    FOR field IN SELECT k FROM unnest(ARRAY['unordered', 'once']) AS k LOOP
        IF options ? field.k AND jsonb_typeof(options -> field.k) <> 'boolean' THEN
            PERFORM outbox_refuse(format('%s: option %s must be true or false, not %s',
                                         fn, field.k, options -> field.k));
        END IF;
    END LOOP;

    -- As outbox::emit_once: the id recorded first, so a retry finds it.
    IF (options -> 'once') = 'true' THEN
        INSERT INTO outbox_event_ids (id) VALUES (outbox_emit.id) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    IF (options -> 'unordered') = 'true' THEN
        INSERT INTO outbox_event_log AS l (xid, id, aggregatetype, aggregateid, type, payload, headers,
                                           stream, publish_at)
        VALUES (pg_current_xact_id(), outbox_emit.id, aggregate_type, aggregate_id, event_type, payload,
                headers, stream_name, publish)
        RETURNING l.position INTO "position";
    ELSE
        -- emit_event.sql, word for word: the lock first, then the position.
        INSERT INTO outbox_event_log AS l (xid, id, aggregatetype, aggregateid, type, payload, headers,
                                           stream, publish_at)
        SELECT pg_current_xact_id(), outbox_emit.id, aggregate_type, aggregate_id, event_type, payload,
               headers, stream_name, publish
        FROM pg_advisory_xact_lock(1869574002, hashtext(aggregate_type || '/' || aggregate_id)) AS locked
        RETURNING l.position INTO "position";
    END IF;
END
$$;
