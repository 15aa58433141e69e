-- Hands on ordering keys that outcomes let go of but could not take at
-- the time, another transaction holding their row (migration 23): each key
-- whose row it can take within 10 ms (a key without a row gets one) goes
-- to its next tasks (outbox_keys_advance, which wakes their queues).
-- $1 queues text[], $2 keys text[]. Returns the keys not taken.
WITH keys AS (
    SELECT * FROM outbox_keys_try_lock($1::text[], $2::text[], interval '10 milliseconds')
),
handed AS (
    SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key)) AS n
    FROM keys WHERE held
    HAVING count(*) > 0
)
SELECT queue, ordering_key FROM keys
WHERE held IS NOT TRUE AND (SELECT count(*) FROM handed) >= 0
