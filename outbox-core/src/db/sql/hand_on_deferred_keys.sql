-- Hands on ordering keys that outcomes let go of but could not take at
-- the time, another transaction holding their row (migration 23): each key
-- whose row it can take within 10 ms (a key without a row gets one) goes
-- to its next tasks (outbox_keys_hand_on_held, which wakes their queues).
-- $1 queues text[], $2 keys text[]. Returns the keys not taken.
WITH keys AS (
    SELECT * FROM outbox_keys_try_lock($1::text[], $2::text[], interval '10 milliseconds')
),
handed AS (
    SELECT count(*) AS n
    FROM (SELECT array_agg(queue) AS q, array_agg(ordering_key) AS k
          FROM keys WHERE held
          HAVING count(*) > 0) AS taken,
         LATERAL outbox_keys_hand_on_held(taken.q, taken.k, '{}'::text[], '{}'::int[],
                                          NULL::text, NULL::timestamptz) AS h
)
SELECT queue, ordering_key FROM keys
WHERE held IS NOT TRUE AND (SELECT count(*) FROM handed) >= 0
