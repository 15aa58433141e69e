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
-- outbox_keys_try_lock takes what it can of a set of keys' rows without
-- waiting (SKIP LOCKED) and says of each key whether it is now held
-- (true), held by another transaction (false), or has no row this
-- statement can see (null: removed by maintenance, or being added by a
-- transaction still open). An outcome hands on the keys it holds and
-- returns the others to its worker, which hands them on in statements of
-- their own once they can be taken (worker/deferred_keys.rs); a worker that
-- dies first leaves them to maintenance's outbox_keys_advance of every
-- waiting key.
CREATE FUNCTION outbox_keys_try_lock(q text[], k text[])
RETURNS TABLE (queue text, ordering_key text, held boolean)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH wanted AS (
        SELECT DISTINCT x.q, x.k FROM unnest(q, k) AS x(q, k) WHERE x.k IS NOT NULL
    ),
    locked AS (
        SELECT o.queue, o.ordering_key FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT w.q, w.k FROM wanted AS w)
        FOR UPDATE SKIP LOCKED
    )
    SELECT w.q, w.k,
           CASE WHEN l.queue IS NOT NULL THEN true
                WHEN EXISTS (SELECT 1 FROM outbox_keys AS e
                             WHERE e.queue = w.q AND e.ordering_key = w.k) THEN false
           END
    FROM wanted AS w
    LEFT JOIN locked AS l ON l.queue = w.q AND l.ordering_key = w.k;
END
$$;
