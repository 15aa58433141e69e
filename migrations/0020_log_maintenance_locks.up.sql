-- outbox: the event log's maintenance takes its locks before it looks.
--
-- Two ways a committed event could be passed over, found by reading the
-- functions against a relay's reads (both reproduced on PostgreSQL 15):
--
-- * outbox_event_log_cover moved the default partition's rows for a new
--   partition's range while a relay's read could be planning against the
--   old list of partitions: the read, planned before the move and run
--   after it, saw the rows in neither place. It now holds the log itself
--   while it moves rows (only then: a partition made ahead of its day
--   moves none), so a read waits before it plans.
-- * outbox_event_log_drop checked that every cursor had passed a
--   partition before it took the partition's lock: an emitter's event
--   committed while the DROP waited for that lock was dropped unseen. It
--   now looks again once it holds the lock.
--
-- Both keep their signatures; only their bodies change.

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
    moving boolean;
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
    -- Rows the default partition holds for the range move in under the
    -- log's own lock, taken before the default's (the order every
    -- statement on the log locks in): a relay's read planned before the
    -- move would not know the new partition, and if it then ran after the
    -- move its snapshot would miss the rows in both places. Holding the
    -- log makes the read wait before it plans. Without such rows (the
    -- usual case, a partition made ahead of its day) emitters do not wait;
    -- rows that arrive after the look are left for a later round.
    moving := EXISTS (SELECT 1 FROM outbox_event_log_default AS d
                      WHERE d.created_at >= lo AND d.created_at < hi);
    IF moving THEN
        EXECUTE format('LOCK TABLE %I.outbox_event_log IN ACCESS EXCLUSIVE MODE', schema_name);
    END IF;
    EXECUTE format('LOCK TABLE %I.outbox_event_log_default IN SHARE ROW EXCLUSIVE MODE', schema_name);
    IF NOT moving AND EXISTS (SELECT 1 FROM outbox_event_log_default AS d
                              WHERE d.created_at >= lo AND d.created_at < hi) THEN
        RAISE EXCEPTION 'events arrived in the default partition for % to % while its partition was made; the next round moves them', lo, hi
            USING ERRCODE = 'lock_not_available';
    END IF;
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
    look integer;
BEGIN
    PERFORM pg_advisory_xact_lock(7310582910364481892);
    FOR p IN SELECT * FROM outbox_event_log_partitions() AS l
             WHERE l.upper_bound <= quiet ORDER BY l.lower_bound
    LOOP
        -- Looked at twice. First without a lock, where most rounds end (a
        -- subscription has not passed the oldest partition yet), so that
        -- emitters do not wait for a round that drops nothing. Then, for a
        -- drop, again once the log and the partition are locked: an
        -- emitter still writing there (an open or prepared transaction)
        -- holds them, so the lock waits for it (and gives up after
        -- lock_timeout, for a later round), and once it is held every
        -- event the partition will ever hold is visible. Looked at only
        -- before the lock, an event whose transaction committed while the
        -- DROP waited was dropped unseen.
        FOR look IN 1..2 LOOP
            IF look = 2 THEN
                EXECUTE format('LOCK TABLE %I.outbox_event_log, %I.%I IN ACCESS EXCLUSIVE MODE',
                               p.schema_name, p.schema_name, p.table_name);
            END IF;
            EXECUTE format('SELECT max(position) FROM %I.%I', p.schema_name, p.table_name)
                INTO last_position;
            SELECT coalesce(bool_and(last_position IS NULL
                                     OR (c.position >= last_position
                                         AND NOT last_position >= ANY (c.gaps))), false)
                INTO passed
            FROM outbox_event_cursors AS c;
            IF NOT passed AND p.upper_bound > max_age THEN
                -- Later partitions cannot have been passed either.
                RETURN;
            END IF;
        END LOOP;
        EXECUTE format('DROP TABLE %I.%I', p.schema_name, p.table_name);
        dropped := p.table_name;
        forced := NOT passed;
        RETURN;
    END LOOP;
END
$$;
