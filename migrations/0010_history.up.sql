-- outbox: finished tasks leave the table that claims scan. A successful
-- task moves, in its outcome's own statement, to outbox_task_history, a
-- table partitioned by finish time; retention drops whole partitions
-- instead of deleting rows. outbox_tasks keeps what is live (pending,
-- running, waiting to retry), the dead (the audit trail, retryable), and
-- completed tasks whose uniqueness covers COMPLETED (their unique index
-- lives on outbox_tasks; they leave with the old row-by-row cleanup).
--
-- Why: every claimed task leaves a dead entry at the front of the claim
-- index until vacuum removes it, and a vacuum scans every index of the
-- table whole. With the history in outbox_tasks those indexes held every
-- completed task and each vacuum of a table with a million rows took long
-- enough that a long drain slowed to half its speed; a table of live rows
-- is vacuumed in a moment.

CREATE TABLE outbox_task_history (
    id           bigint NOT NULL,
    task_type    text NOT NULL,
    queue        text NOT NULL,
    payload      jsonb NOT NULL,
    priority     smallint NOT NULL,
    retry_count  integer NOT NULL,
    max_attempts integer NOT NULL,
    claims       integer NOT NULL,
    execute_at   timestamptz NOT NULL,
    created_at   timestamptz NOT NULL,
    attempted_at timestamptz,
    -- The partition key: when the task completed.
    finished_at  timestamptz NOT NULL,
    -- The error of an earlier failed attempt, if any.
    last_error   text,
    result       jsonb,
    unique_key   text,
    ordering_key text,
    key_seq      bigint
) PARTITION BY RANGE (finished_at);

-- `tasks show`, `outbox::result` and paging by id, in every partition. Not
-- unique: a unique index of a partitioned table must contain the partition
-- key; the id is unique by construction (one identity, moved once).
CREATE INDEX outbox_task_history_id_idx ON outbox_task_history (id);

-- Catches rows no partition covers (maintenance stopped for days, or a
-- test's clock far from now), so that an outcome never fails for want of
-- a partition. Creating a partition moves the rows it covers out of here.
CREATE TABLE outbox_task_history_default PARTITION OF outbox_task_history DEFAULT;
CREATE INDEX outbox_task_history_default_finished_idx
    ON outbox_task_history_default (finished_at);

-- The functions below read partition bounds back from their text
-- (pg_get_expr), which follows the session's DateStyle and TimeZone; they
-- pin both, so that a bound reads back as the instant it was written.

-- The history's partitions with their bounds, read from the catalog (the
-- default partition has none and is left out).
CREATE FUNCTION outbox_history_partitions()
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
    WHERE i.inhparent = 'outbox_task_history'::regclass
      AND b IS NOT NULL
$$;

-- Makes sure a partition covers time t: if none does, creates one of the
-- given width (aligned to multiples of it since the Unix epoch, so daily
-- partitions start at midnight UTC), narrowed where a neighbour already
-- covers part of it. Rows the default partition holds for that range move
-- into it. Returns whether it created one.
--
-- The new table is created on its own and then attached: CREATE TABLE ...
-- PARTITION OF would lock the whole history (ACCESS EXCLUSIVE, blocking
-- every outcome); ATTACH takes SHARE UPDATE EXCLUSIVE on it, which outcomes
-- do not wait for, and ACCESS EXCLUSIVE on the default partition, which
-- only outcomes landing there and readers of the history wait for. The
-- default partition is locked against inserts before its rows move, or an
-- outcome landing there meanwhile would make the ATTACH fail. A short
-- lock_timeout keeps the DDL from queueing behind a long reader and holding
-- others up meanwhile; maintenance tries again next round. Run it as the
-- owner of outbox_task_history (the role that migrated).
CREATE FUNCTION outbox_history_cover(t timestamptz, width interval) RETURNS boolean
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
        RAISE EXCEPTION 'history partitions must be at least a minute wide, not %', width
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- One creator or dropper at a time (an arbitrary constant names the lock).
    PERFORM pg_advisory_xact_lock(7310582910364481891);
    IF EXISTS (SELECT 1 FROM outbox_history_partitions() AS p
               WHERE p.lower_bound <= t AND t < p.upper_bound) THEN
        RETURN false;
    END IF;
    lo := to_timestamp(floor(extract(epoch FROM t) / w) * w);
    hi := to_timestamp((floor(extract(epoch FROM t) / w) + 1) * w);
    SELECT max(p.upper_bound) INTO below FROM outbox_history_partitions() AS p WHERE p.upper_bound <= t;
    SELECT min(p.lower_bound) INTO above FROM outbox_history_partitions() AS p WHERE p.lower_bound > t;
    lo := greatest(lo, below);
    hi := least(hi, above);
    SELECT n.nspname INTO schema_name
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = 'outbox_task_history'::regclass;
    part := 'outbox_task_history_' || to_char(lo, 'YYYYMMDD"_"HH24MISS');
    EXECUTE format('CREATE TABLE %I.%I (LIKE %I.outbox_task_history INCLUDING DEFAULTS)',
                   schema_name, part, schema_name);
    -- A constraint that proves the range lets ATTACH skip scanning the new
    -- table; it is dropped once attached.
    EXECUTE format('ALTER TABLE %I.%I ADD CONSTRAINT %I CHECK (finished_at >= %L AND finished_at < %L)',
                   schema_name, part, part || '_range', lo, hi);
    EXECUTE format('LOCK TABLE %I.outbox_task_history_default IN SHARE ROW EXCLUSIVE MODE',
                   schema_name);
    EXECUTE format('WITH moved AS (DELETE FROM %I.outbox_task_history_default
                                   WHERE finished_at >= $1 AND finished_at < $2 RETURNING *)
                    INSERT INTO %I.%I SELECT * FROM moved',
                   schema_name, schema_name, part) USING lo, hi;
    EXECUTE format('ALTER TABLE %I.outbox_task_history ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                   schema_name, schema_name, part, lo, hi);
    EXECUTE format('ALTER TABLE %I.%I DROP CONSTRAINT %I', schema_name, part, part || '_range');
    RETURN true;
END
$$;

-- Retention: drops the oldest partition that ends at or before `before`
-- (all its tasks finished before then), whole, without deleting a row;
-- returns its name, or null when none is left. One per call, so that each
-- drop is its own transaction. DROP TABLE of a partition takes ACCESS
-- EXCLUSIVE on the history for a moment: outcomes moving tasks there wait
-- for it, and it waits for whoever reads the history (a long `tasks list`,
-- pg_dump): the short lock_timeout bounds that wait, and maintenance tries
-- again next round. Run it as the owner of outbox_task_history.
CREATE FUNCTION outbox_history_drop(before timestamptz) RETURNS text
LANGUAGE plpgsql
SET TimeZone = 'UTC'
SET DateStyle = 'ISO, YMD'
SET lock_timeout = '100ms'
AS $$
DECLARE
    p record;
BEGIN
    PERFORM pg_advisory_xact_lock(7310582910364481891);
    SELECT * INTO p FROM outbox_history_partitions() AS h
    WHERE h.upper_bound <= before ORDER BY h.lower_bound LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    EXECUTE format('DROP TABLE %I.%I', p.schema_name, p.table_name);
    RETURN p.table_name;
END
$$;

-- Every task, live and finished: what operators' listings, `tasks show`,
-- stats and the testing helpers read. A task moves from outbox_tasks to the
-- history in one transaction, so one statement sees it exactly once.
CREATE VIEW outbox_all_tasks AS
SELECT id, task_type, queue, payload, state, priority, retry_count, max_attempts, claims,
       execute_at, created_at, updated_at, claimed_by, heartbeat_at, finished_at, dead_at,
       last_error, unique_key, unique_states, result, cancel_requested_at, ordering_key,
       key_seq, blocked, skip_dead, attempted_at
FROM outbox_tasks
UNION ALL
SELECT id, task_type, queue, payload, 'completed'::outbox_task_state, priority, retry_count,
       max_attempts, claims, execute_at, created_at, finished_at, NULL::text, NULL::timestamptz,
       finished_at, NULL::timestamptz, last_error, unique_key, NULL::smallint, result,
       NULL::timestamptz, ordering_key, key_seq, false, false, attempted_at
FROM outbox_task_history;

-- Existing completed tasks move to the history (every row kept): first
-- the daily partitions they need, and today's and the next two days'.
SELECT outbox_history_cover(t, interval '1 day')
FROM (SELECT DISTINCT date_trunc('day', coalesce(finished_at, updated_at) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS t
      FROM outbox_tasks
      WHERE state = 'completed' AND coalesce(unique_states & 8, 0) = 0
      UNION
      SELECT now() + d * interval '1 day' FROM generate_series(0, 2) AS d) AS days
ORDER BY t;

WITH moved AS (
    DELETE FROM outbox_tasks
    WHERE state = 'completed' AND coalesce(unique_states & 8, 0) = 0
    RETURNING *
)
INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count,
                                 max_attempts, claims, execute_at, created_at, attempted_at,
                                 finished_at, last_error, result, unique_key, ordering_key, key_seq)
SELECT id, task_type, queue, payload, priority, retry_count, max_attempts, claims, execute_at,
       created_at, attempted_at, coalesce(finished_at, updated_at), last_error, result,
       unique_key, ordering_key, key_seq
FROM moved;
