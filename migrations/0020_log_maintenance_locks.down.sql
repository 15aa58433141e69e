-- Back to migration 12's retention and partition functions.
CREATE OR REPLACE FUNCTION outbox_event_log_cover(t timestamptz, width interval) RETURNS boolean
LANGUAGE plpgsql
SET TimeZone = 'UTC'
SET DateStyle = 'ISO, YMD'
SET lock_timeout = '100ms'
AS $$
DECLARE
    w double precision := extract(epoch FROM width);
    lo timestamptz;
    hi timestamptz;
    below timestamptz;
    above timestamptz;
    schema_name text;
    part text;
BEGIN
    IF w IS NULL OR w < 60 THEN
        RAISE EXCEPTION 'event log partitions must be at least a minute wide, not %', width
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- One creator or dropper at a time (an arbitrary constant names the lock).
    PERFORM pg_advisory_xact_lock(7310582910364481892);
    IF EXISTS (SELECT 1 FROM outbox_event_log_partitions() AS p
               WHERE p.lower_bound <= t AND t < p.upper_bound) THEN
        RETURN false;
    END IF;
    lo := to_timestamp(floor(extract(epoch FROM t) / w) * w);
    hi := to_timestamp((floor(extract(epoch FROM t) / w) + 1) * w);
    SELECT max(p.upper_bound) INTO below FROM outbox_event_log_partitions() AS p WHERE p.upper_bound <= t;
    SELECT min(p.lower_bound) INTO above FROM outbox_event_log_partitions() AS p WHERE p.lower_bound > t;
    lo := greatest(lo, below);
    hi := least(hi, above);
    SELECT n.nspname INTO schema_name
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = 'outbox_event_log'::regclass;
    part := 'outbox_event_log_' || to_char(lo, 'YYYYMMDD"_"HH24MISS');
    EXECUTE format('CREATE TABLE %I.%I (LIKE %I.outbox_event_log INCLUDING DEFAULTS)',
                   schema_name, part, schema_name);
    EXECUTE format('ALTER TABLE %I.%I ADD CONSTRAINT %I CHECK (created_at >= %L AND created_at < %L)',
                   schema_name, part, part || '_range', lo, hi);
    EXECUTE format('LOCK TABLE %I.outbox_event_log_default IN SHARE ROW EXCLUSIVE MODE', schema_name);
    EXECUTE format('WITH moved AS (DELETE FROM %I.outbox_event_log_default
                                   WHERE created_at >= $1 AND created_at < $2 RETURNING *)
                    INSERT INTO %I.%I (xid, position, id, aggregatetype, aggregateid, type, payload,
                                       headers, stream, publish_at, created_at)
                    SELECT xid, position, id, aggregatetype, aggregateid, type, payload,
                           headers, stream, publish_at, created_at FROM moved',
                   schema_name, schema_name, part) USING lo, hi;
    EXECUTE format('ALTER TABLE %I.outbox_event_log ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                   schema_name, schema_name, part, lo, hi);
    EXECUTE format('ALTER TABLE %I.%I DROP CONSTRAINT %I', schema_name, part, part || '_range');
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION outbox_event_log_drop(quiet timestamptz, max_age timestamptz,
                                      OUT dropped text, OUT forced boolean)
LANGUAGE plpgsql
SET TimeZone = 'UTC'
SET DateStyle = 'ISO, YMD'
SET lock_timeout = '100ms'
AS $$
DECLARE
    p record;
    last_position bigint;
    passed boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(7310582910364481892);
    FOR p IN SELECT * FROM outbox_event_log_partitions() AS l
             WHERE l.upper_bound <= quiet ORDER BY l.lower_bound
    LOOP
        EXECUTE format('SELECT max(position) FROM %I.%I', p.schema_name, p.table_name)
            INTO last_position;
        SELECT coalesce(bool_and(last_position IS NULL
                                 OR (c.position >= last_position
                                     AND NOT last_position >= ANY (c.gaps))), false)
            INTO passed
        FROM outbox_event_cursors AS c;
        IF passed OR p.upper_bound <= max_age THEN
            EXECUTE format('DROP TABLE %I.%I', p.schema_name, p.table_name);
            dropped := p.table_name;
            forced := NOT passed;
            RETURN;
        END IF;
        -- Later partitions cannot have been passed either.
        RETURN;
    END LOOP;
END
$$;
