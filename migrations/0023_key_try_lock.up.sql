-- Outcomes no longer wait for an application's open transaction on an
-- ordering key.
--
-- A submit of a keyed task holds its key's row in outbox_keys until the
-- submitting transaction ends. An outcome batch that let go of that key
-- locked the row too (FOR UPDATE) and waited, with every other outcome of
-- its batch, of any queue, until the submitter ended or the statement
-- timed out; retried, it waited again, and an application transaction
-- left open on two keys stopped a worker's outcomes and then its claims.
--
-- outbox_keys_try_lock takes what it can of a set of keys' rows and says
-- of each key whether it is now held (true), held by another transaction
-- (false), or has no row (null). It takes the free rows without waiting
-- (SKIP LOCKED), then waits for the others, one key at a time in key
-- order, until `patience` has passed in all: the engine's own statements
-- hold a key for milliseconds (another outcome, maintenance's advance of
-- waiting keys), an application's open transaction for as long as it
-- likes. A key without a row (maintenance removed it) gets one within the
-- same patience; the insert waits for a transaction adding the same row.
-- A key not taken by then is left as it was found (each wait is a
-- subtransaction of its own, undone with its lock_timeout when it runs
-- out), and no wait can outlast the patience, so a statement that holds
-- other keys already never waits on an application while holding them.
--
-- An outcome hands on the keys it holds and returns the others to its
-- worker, which hands them on in statements of their own once they can be
-- taken (worker/deferred_keys.rs); a worker that dies first, or whose
-- outcome's reply was lost with the keys it owed, leaves them to
-- maintenance's advance of every waiting key (each cleanup).
CREATE FUNCTION outbox_keys_try_lock(q text[], k text[], patience interval)
RETURNS TABLE (queue text, ordering_key text, held boolean)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    wanted_q text[];
    wanted_k text[];
    taken boolean[];
    deadline timestamptz;
    left_ms bigint;
    before text := current_setting('lock_timeout');
    i integer;
BEGIN
    WITH wanted AS (
        SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL
    ),
    locked AS (
        SELECT o.queue, o.ordering_key FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT w.q, w.k FROM wanted AS w)
        FOR UPDATE SKIP LOCKED
    )
    SELECT coalesce(array_agg(f.q ORDER BY f.q COLLATE "C", f.k COLLATE "C"), '{}'),
           coalesce(array_agg(f.k ORDER BY f.q COLLATE "C", f.k COLLATE "C"), '{}'),
           coalesce(array_agg(f.held ORDER BY f.q COLLATE "C", f.k COLLATE "C"), '{}')
    INTO wanted_q, wanted_k, taken
    FROM (SELECT w.q, w.k,
                 CASE WHEN l.queue IS NOT NULL THEN true
                      WHEN EXISTS (SELECT 1 FROM outbox_keys AS e
                                   WHERE e.queue = w.q AND e.ordering_key = w.k) THEN false
                 END AS held
          FROM wanted AS w
          LEFT JOIN locked AS l ON l.queue = w.q AND l.ordering_key = w.k) AS f;
    deadline := clock_timestamp() + patience;
    FOR i IN 1 .. cardinality(taken) LOOP
        CONTINUE WHEN taken[i];
        left_ms := floor(extract(epoch FROM deadline - clock_timestamp()) * 1000);
        EXIT WHEN left_ms < 1;
        BEGIN
            PERFORM set_config('lock_timeout', left_ms::text || 'ms', true);
            IF taken[i] IS NULL THEN
                INSERT INTO outbox_keys (queue, ordering_key) VALUES (wanted_q[i], wanted_k[i])
                ON CONFLICT (queue, ordering_key) DO NOTHING;
            END IF;
            PERFORM 1 FROM outbox_keys AS o
            WHERE o.queue = wanted_q[i] AND o.ordering_key = wanted_k[i]
            FOR UPDATE;
            IF FOUND THEN
                taken[i] := true;
            END IF;
            PERFORM set_config('lock_timeout', before, true);
        EXCEPTION WHEN lock_not_available THEN
            -- Held for longer than the patience: left to the caller.
            NULL;
        END;
    END LOOP;
    RETURN QUERY
    SELECT t.q, t.k, t.held FROM unnest(wanted_q, wanted_k, taken) AS t(q, k, held);
END
$$;
