-- Back to migration 42's outbox_emit: a NULL payload is emitted as the
-- JSON null.

-- Emits an event in the caller's transaction, after the aggregate's earlier
-- events in commit order (emit_event.sql), and returns its id and
-- position. Headers: a JSON object of text values, or null. Options (all
-- optional): id (a UUID; without it a new UUIDv7), stream (default
-- 'events'), delay (seconds or interval text), unordered (true: no lock on
-- the aggregate, no order), once (true: skip an id emitted with once
-- before for the same event; position is then null and nothing is
-- written; an id recorded for a different event is refused).
CREATE OR REPLACE FUNCTION outbox_emit(aggregate_type text, aggregate_id text, event_type text, payload jsonb,
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
    event_digest text;
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
            -- As outbox::emit (Event::validate): relays pass it on as the
            -- message's trace context, which consumers' tracers parse.
            IF lower(header.key) = 'traceparent'
               AND ((header.value #>> '{}') !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                    OR (header.value #>> '{}') ~ '^00-0{32}-' OR (header.value #>> '{}') ~ '^00-[0-9a-f]{32}-0{16}-') THEN
                PERFORM outbox_refuse(format(
                    '%s: header traceparent %s is not a W3C trace context (00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, lowercase, ids not all zero)',
                    fn, header.value));
            END IF;
        END LOOP;
    END IF;

    IF options ? 'id' THEN
        BEGIN
            id := outbox_option_text(fn, options, 'id')::uuid;
        EXCEPTION WHEN invalid_text_representation THEN
            PERFORM outbox_refuse(format('%s: its id %s is not a UUID', fn, options -> 'id'));
        END;
        IF id = '00000000-0000-0000-0000-000000000000' THEN
            PERFORM outbox_refuse(fn || ': its id is the nil UUID: give each event an id of its own');
        END IF;
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

    -- As outbox::emit_once (claim_event_id.sql and
    -- event_id_digest_differs.sql, the same digest): the id recorded
    -- first, so a retry finds it; an id recorded for another event is
    -- refused, not skipped.
    IF (options -> 'once') = 'true' THEN
        event_digest := outbox_event_digest(aggregate_type, aggregate_id, event_type, payload);
        INSERT INTO outbox_event_ids AS e (id, digest) VALUES (outbox_emit.id, event_digest)
        ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM outbox_event_ids AS e
                       WHERE e.id = outbox_emit.id AND e.digest <> event_digest) THEN
                PERFORM outbox_refuse(format(
                    '%s: event id %s was emitted before for a different event (another aggregate, type or payload than %s/%s %s): nothing written; give this event an id of its own',
                    fn, outbox_emit.id, aggregate_type, aggregate_id, event_type));
            END IF;
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
