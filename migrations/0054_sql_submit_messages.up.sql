-- The SQL submit's messages say what is wrong: a priority given as text
-- ("3") is not a number, where it was called out of range, and a
-- unique_period under a second names the same upper bound (36500 days) as
-- one over it, where the two said "100 years" and "36500 days". The
-- function is otherwise migration 47's.
CREATE OR REPLACE FUNCTION outbox_submit(task_type text, payload jsonb, options jsonb DEFAULT '{}')
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
    attempts integer;
    new_id bigint;
BEGIN
    -- An option given as JSON null counts as not given.
    options := jsonb_strip_nulls(coalesce(options, '{}'));
    PERFORM outbox_check_options(fn, options, ARRAY['queue', 'priority', 'delay', 'run_at',
        'ordering_key', 'unique_key', 'unique_period', 'unique_including', 'notify',
        'max_attempts']);
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
        IF jsonb_typeof(options -> 'priority') <> 'number' THEN
            PERFORM outbox_refuse(format('%s: priority %s is not a number: use 0 (first) to 9 (last)',
                                         fn, options -> 'priority'));
        END IF;
        IF (options ->> 'priority')::numeric NOT IN (0, 1, 2, 3, 4, 5, 6, 7, 8, 9) THEN
            PERFORM outbox_refuse(format('%s: priority %s is out of range: use 0 (first) to 9 (last)',
                                         fn, options -> 'priority'));
        END IF;
        prio := (options -> 'priority')::numeric::smallint;
    ELSE
        prio := coalesce(decl.priority, 0);
    END IF;

    IF options ? 'max_attempts' THEN
        IF jsonb_typeof(options -> 'max_attempts') <> 'number'
           OR (options ->> 'max_attempts')::numeric NOT BETWEEN 1 AND 10000
           OR (options ->> 'max_attempts')::numeric % 1 <> 0 THEN
            PERFORM outbox_refuse(format('%s: max_attempts %s is out of range: use 1 (no retry) to 10000',
                                         fn, options -> 'max_attempts'));
        END IF;
        -- Through numeric: jsonb keeps a number as written, and 3.0 is a
        -- whole number whose text no integer cast takes.
        attempts := (options -> 'max_attempts')::numeric::integer;
    ELSE
        attempts := coalesce(decl.max_attempts, 10);
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
        -- As the Rust side refuses it (and an empty ordering key here): a
        -- field left blank, which would make every such task one task.
        IF ukey = '' THEN
            PERFORM outbox_refuse(fn || ': a unique key cannot be empty: use 1 to 1024 bytes');
        END IF;
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
                PERFORM outbox_refuse(format('%s: unique_period %s is out of range: use 1 second to 36500 days',
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
        VALUES (task_type, q, payload, prio, attempts, due,
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
