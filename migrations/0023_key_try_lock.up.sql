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
-- (false), or has no row this statement can see (null: removed by
-- maintenance, or being added by a transaction still open). It takes the
-- free rows without waiting (SKIP LOCKED), then waits at most `patience`
-- for the others together: the engine's own statements hold a key for
-- milliseconds (another outcome, maintenance's advance of waiting keys),
-- an application's open transaction for as long as it likes. An outcome
-- hands on the keys it holds and returns the others to its worker, which
-- hands them on in statements of their own once they can be taken
-- (worker/deferred_keys.rs); a worker that dies first leaves them to
-- maintenance's advance of every waiting key.
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
    busy_q text[];
    busy_k text[];
    got_q text[];
    got_k text[];
    before text := current_setting('lock_timeout');
BEGIN
    WITH wanted AS (
        SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL
    ),
    locked AS (
        SELECT o.queue, o.ordering_key FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT w.q, w.k FROM wanted AS w)
        FOR UPDATE SKIP LOCKED
    ),
    found AS (
        SELECT w.q, w.k,
               CASE WHEN l.queue IS NOT NULL THEN true
                    WHEN EXISTS (SELECT 1 FROM outbox_keys AS e
                                 WHERE e.queue = w.q AND e.ordering_key = w.k) THEN false
               END AS held
        FROM wanted AS w
        LEFT JOIN locked AS l ON l.queue = w.q AND l.ordering_key = w.k
    )
    SELECT coalesce(array_agg(f.q), '{}'), coalesce(array_agg(f.k), '{}'),
           coalesce(array_agg(f.held), '{}'),
           coalesce(array_agg(f.q) FILTER (WHERE f.held IS FALSE), '{}'),
           coalesce(array_agg(f.k) FILTER (WHERE f.held IS FALSE), '{}')
    INTO wanted_q, wanted_k, taken, busy_q, busy_k
    FROM found AS f;
    IF cardinality(busy_q) > 0 AND patience > interval '0' THEN
        BEGIN
            PERFORM set_config('lock_timeout',
                               greatest(1, (extract(epoch FROM patience) * 1000)::bigint)::text || 'ms',
                               true);
            SELECT coalesce(array_agg(l.queue), '{}'), coalesce(array_agg(l.ordering_key), '{}')
            INTO got_q, got_k
            FROM (SELECT o.queue, o.ordering_key FROM outbox_keys AS o
                  WHERE (o.queue, o.ordering_key) IN (SELECT * FROM unnest(busy_q, busy_k))
                  ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
                  FOR UPDATE) AS l;
            PERFORM set_config('lock_timeout', before, true);
            -- The busy keys are held now, but for a row its holder deleted
            -- meanwhile (no row: null, as above).
            taken := ARRAY(
                SELECT CASE WHEN NOT t.held AND (t.q, t.k) IN (SELECT * FROM unnest(got_q, got_k))
                            THEN true
                            WHEN NOT t.held THEN NULL
                            ELSE t.held END
                FROM unnest(wanted_q, wanted_k, taken) WITH ORDINALITY AS t(q, k, held, i)
                ORDER BY t.i);
        EXCEPTION WHEN lock_not_available THEN
            -- Held for longer than the patience: left to the caller (the
            -- locks and the setting of this block are undone with it).
            NULL;
        END;
    END IF;
    RETURN QUERY
    SELECT t.q, t.k, t.held FROM unnest(wanted_q, wanted_k, taken) AS t(q, k, held);
END
$$;
