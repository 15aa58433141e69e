-- Back to migration 8's outbox_keys_advance, which only hands keys on (with
-- the fix of its missing-key path, which migration 17 made).
CREATE OR REPLACE FUNCTION outbox_keys_advance(q text[], k text[]) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    wanted integer;
    locked integer;
    moved integer := 0;
    woken text;
BEGIN
    SELECT count(*) INTO wanted
    FROM (SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL) AS keys;
    IF wanted = 0 THEN
        RETURN 0;
    END IF;
    SELECT count(*) INTO locked FROM (
        SELECT 1 FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT x.q, x.k FROM unnest(q, k) AS x(q, k))
        ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
        FOR UPDATE) AS l;
    IF locked < wanted THEN
        -- Keys whose row maintenance removed meanwhile: add and lock them.
        INSERT INTO outbox_keys (queue, ordering_key)
        SELECT d.q, d.k
        FROM (SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL) AS d
        ORDER BY d.q COLLATE "C", d.k COLLATE "C"
        ON CONFLICT (queue, ordering_key) DO NOTHING;
        PERFORM 1 FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT x.q, x.k FROM unnest(q, k) AS x(q, k))
        ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
        FOR UPDATE;
    END IF;
    FOR woken IN
        WITH keys AS (
            SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL
        ),
        room AS (
            SELECT keys.q, keys.k,
                   coalesce(s.per_key_concurrency, 1) - (
                       SELECT count(*) FROM (
                           SELECT 1 FROM outbox_tasks AS h
                           WHERE h.queue = keys.q AND h.ordering_key = keys.k
                             AND h.ordering_key IS NOT NULL AND NOT h.blocked
                             AND h.state <> 'completed' AND (h.dead_at IS NULL OR NOT h.skip_dead)
                           LIMIT coalesce(s.per_key_concurrency, 1)) AS holders) AS free
            FROM keys LEFT JOIN outbox_queues AS s ON s.name = keys.q
        ),
        next AS (
            SELECT w.id
            FROM room, LATERAL (
                -- Only tasks that still need the key (belt and braces: a
                -- cancel takes a waiting task out of the line itself).
                SELECT t.id FROM outbox_tasks AS t
                WHERE t.queue = room.q AND t.ordering_key = room.k AND t.blocked
                  AND t.state <> 'completed' AND (t.dead_at IS NULL OR NOT t.skip_dead)
                ORDER BY t.key_seq
                LIMIT greatest(room.free, 0)) AS w
            WHERE room.free > 0
        ),
        handed AS (
            UPDATE outbox_tasks AS t SET blocked = false
            FROM next
            WHERE t.id = next.id AND t.blocked
            RETURNING t.queue
        )
        SELECT queue FROM handed
    LOOP
        moved := moved + 1;
        -- Wakes the queue's workers at commit (PostgreSQL folds repeats
        -- within a transaction into one notification).
        PERFORM pg_notify('outbox_tasks', woken);
    END LOOP;
    RETURN moved;
END
$$;

DROP FUNCTION outbox_keys_hand_on(text[], text[], text[], integer[], text, timestamptz);
