-- outbox: events move from tasks to an append-only log.
--
-- Before, an event was a task with an ordering key: its insert ran a
-- trigger that locked a row of outbox_keys, and publishing it took five
-- more row writes. Emit cost the business transaction 4.5x a plain row and
-- was refused at REPEATABLE READ and SERIALIZABLE. Now emit appends one row
-- to outbox_event_log: no trigger, no row lock, legal at every isolation
-- level. Relays read the log without writing it (outbox::relay): each
-- subscription keeps a cursor per partition of its aggregates: a position
-- and the positions at or below it not yet seen (gaps: open or rolled-back
-- emits). A batch is what became visible past the position or in a gap.
--
-- Per-aggregate commit order: an emitter takes a transaction-scoped
-- advisory lock on its aggregate's hash before it draws the event's
-- position, so two transactions emitting for one aggregate draw their
-- positions in the order they commit (the second waits for the first to
-- end). The lock takes no row and writes no WAL.

-- Positions: the order of an aggregate's events. Drawn from a sequence, so
-- gaps (rolled-back emits) are normal.
CREATE SEQUENCE outbox_event_position_seq AS bigint;

-- Debezium's outbox layout (id, aggregatetype, aggregateid, type, payload)
-- plus what the relays need. Partitioned by day on created_at; retention
-- drops a partition whole once every subscription has passed it.
CREATE TABLE outbox_event_log (
    -- The emitting transaction, 64 bits (never wraps). Its default comes
    -- first so that an insert has its transaction id before it draws a
    -- position: a relay's gap whose transaction is older than every open
    -- one is a rollback (see event_read.sql). Not indexed: each index on
    -- this table is paid by every emit.
    xid            xid8 NOT NULL DEFAULT pg_current_xact_id(),
    position       bigint NOT NULL DEFAULT nextval('outbox_event_position_seq'),
    id             uuid NOT NULL DEFAULT gen_random_uuid(),
    aggregatetype  varchar(255) NOT NULL,
    aggregateid    varchar(255) NOT NULL,
    type           varchar(255) NOT NULL,
    payload        jsonb,
    -- The emitter's headers as one JSON object, or null.
    headers        jsonb,
    -- Which relays read it (Event::queue): `events` unless told otherwise.
    stream         text NOT NULL DEFAULT 'events',
    -- Not published before this time (Event::delay), or null.
    publish_at     timestamptz,
    created_at     timestamptz NOT NULL DEFAULT statement_timestamp()
) PARTITION BY RANGE (created_at);

-- A batch's new events and its cursor's filled gaps, by position: the
-- log's only index.
CREATE INDEX outbox_event_log_position_idx ON outbox_event_log (position);

-- Catches rows no partition covers (maintenance stopped for days), so that
-- an emit never fails for want of a partition.
CREATE TABLE outbox_event_log_default PARTITION OF outbox_event_log DEFAULT;

-- A subscription: one reader of the log (a relay, by its name), its
-- stream, and how many partitions its aggregates are split into.
CREATE TABLE outbox_event_subscriptions (
    name       text PRIMARY KEY,
    stream     text NOT NULL,
    partitions integer NOT NULL CHECK (partitions BETWEEN 1 AND 1024),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- One cursor per partition of a subscription. What it has published is
-- exactly its events at or below `position` except those at the positions
-- in `gaps`, which were not visible when the cursor passed them (their
-- transactions were open, or rolled back). `gap_bounds` holds, for each
-- gap, a transaction id above its emitter's: once every transaction below
-- it has ended, a gap still unseen was rolled back and is forgotten. A
-- batch moves the position forward and fills or forgets gaps. The relay worker holding the
-- lease (`holder` until `lease_until`, on the database's clock) is the only
-- one that publishes the partition; `fence` grows with every new holder and
-- every write names it, so a holder whose lease was taken writes nothing.
CREATE TABLE outbox_event_cursors (
    subscription text NOT NULL REFERENCES outbox_event_subscriptions (name) ON DELETE CASCADE,
    part         integer NOT NULL,
    position     bigint NOT NULL,
    gaps         bigint[] NOT NULL DEFAULT '{}',
    gap_bounds   bigint[] NOT NULL DEFAULT '{}',
    holder       text,
    lease_until  timestamptz,
    fence        bigint NOT NULL DEFAULT 0,
    published    bigint NOT NULL DEFAULT 0,
    advanced_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscription, part)
);

-- The relay workers of each subscription that are alive, each until its
-- last word runs out: partitions are shared out among them.
CREATE TABLE outbox_event_members (
    subscription text NOT NULL REFERENCES outbox_event_subscriptions (name) ON DELETE CASCADE,
    member       text NOT NULL,
    seen_until   timestamptz NOT NULL,
    PRIMARY KEY (subscription, member)
);

-- Events a subscription holds back: a parked aggregate's events, the
-- first being the one the broker refused for good (its error) or one not
-- due yet (Event::delay). Later events of the aggregate join behind it.
-- `retry_at` is when the relay tries the first again: null waits for an
-- operator (`events retry`, `events skip`).
CREATE TABLE outbox_event_parked (
    subscription   text NOT NULL REFERENCES outbox_event_subscriptions (name) ON DELETE CASCADE,
    position       bigint NOT NULL,
    id             uuid NOT NULL,
    aggregatetype  varchar(255) NOT NULL,
    aggregateid    varchar(255) NOT NULL,
    type           varchar(255) NOT NULL,
    payload        jsonb,
    headers        jsonb,
    publish_at     timestamptz,
    aggregate_hash integer NOT NULL,
    created_at     timestamptz NOT NULL,
    parked_at      timestamptz NOT NULL DEFAULT now(),
    retry_at       timestamptz,
    error          text,
    PRIMARY KEY (subscription, position)
);
CREATE INDEX outbox_event_parked_aggregate_idx
    ON outbox_event_parked (subscription, aggregatetype, aggregateid, position);

-- Partitions of the log, with their bounds read from the catalog (the
-- default partition has none and is left out). Bounds are read back from
-- text, so DateStyle and TimeZone are pinned.
CREATE FUNCTION outbox_event_log_partitions()
RETURNS TABLE (schema_name text, table_name text, lower_bound timestamptz, upper_bound timestamptz)
LANGUAGE sql STABLE
SET TimeZone = 'UTC'
SET DateStyle = 'ISO, YMD'
AS $$
    SELECT n.nspname::text, c.relname::text, b[1]::timestamptz, b[2]::timestamptz
    FROM pg_inherits AS i
    JOIN pg_class AS c ON c.oid = i.inhrelid
    JOIN pg_namespace AS n ON n.oid = c.relnamespace,
    LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                         'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)') AS b
    WHERE i.inhparent = 'outbox_event_log'::regclass
      AND b IS NOT NULL
$$;

-- Makes sure a partition of the log covers time t (one `width` wide,
-- aligned on the Unix epoch, narrowed where a neighbour covers part of
-- it); returns whether it made one. Made on its own and attached, which
-- does not wait for emitters (SHARE UPDATE EXCLUSIVE on the log); rows the
-- default partition holds for the range move in first. A short
-- lock_timeout keeps the DDL from queueing behind a long reader;
-- maintenance tries again next round.
CREATE FUNCTION outbox_event_log_cover(t timestamptz, width interval) RETURNS boolean
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

-- Retention: drops the oldest partition that ended at or before `quiet`
-- (no emitter can still be writing there) and that every cursor has
-- passed: its last position at or below the cursor's, and no gap of the
-- cursor at or below it (an open emitter may still be writing there). A
-- partition that ended before `max_age` goes regardless (a subscription
-- stuck for that long loses it; the maintenance leader says so). Returns
-- the partition's name and whether it was forced, or nulls when none is
-- due. With no subscription at all, nothing has passed: a relay started
-- later reads from the start of what is kept. One per call, so that each drop is its own transaction.
CREATE FUNCTION outbox_event_log_drop(quiet timestamptz, max_age timestamptz,
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

-- Today's partition and the next two days'.
SELECT outbox_event_log_cover(now() + d * interval '1 day', interval '1 day')
FROM generate_series(0, 2) AS d;

-- Events still waiting on the old path move to the log, in the order they
-- would have been published (their aggregate's sequence), keeping their
-- ids; dead ones too (a subscription tries them again and parks their
-- aggregate if the broker still refuses). A relay that had published one
-- without recording it publishes it again under the same id.
INSERT INTO outbox_event_log (id, aggregatetype, aggregateid, type, payload, headers, stream)
SELECT coalesce((payload->>'id')::uuid, outbox_event_id(id)),
       payload->>'aggregate_type', payload->>'aggregate_id', payload->>'type',
       payload->'payload', nullif(payload->'headers', '{}'::jsonb), queue
FROM outbox_tasks
WHERE task_type = 'outbox.event'
ORDER BY key_seq NULLS LAST, id;

WITH moved AS (
    DELETE FROM outbox_tasks WHERE task_type = 'outbox.event' RETURNING queue, ordering_key
)
DELETE FROM outbox_keys AS k
USING (SELECT DISTINCT queue, ordering_key FROM moved WHERE ordering_key IS NOT NULL) AS m
WHERE k.queue = m.queue AND k.ordering_key = m.ordering_key
  AND NOT EXISTS (SELECT 1 FROM outbox_tasks AS t
                  WHERE t.queue = k.queue AND t.ordering_key = k.ordering_key);

-- The Debezium mirror goes: Debezium's Outbox Event Router reads the log
-- itself (its columns are the router's defaults).
DROP TRIGGER IF EXISTS outbox_events_mirror ON outbox_tasks;
DROP FUNCTION outbox_events_mirror();
DROP TABLE outbox_events;
