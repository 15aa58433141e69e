-- Hands on ordering keys that outcomes let go of but could not take at
-- the time, another transaction holding their row (migration 23): each key
-- whose row it can take now goes to its next tasks (outbox_keys_advance,
-- which wakes their queues). A key with no row in sight goes through
-- outbox_keys_advance's insert, which waits for a transaction adding the
-- same row. $1 queues text[], $2 keys text[]. Returns the keys whose row
-- is still held elsewhere.
WITH keys AS (
    SELECT * FROM outbox_keys_try_lock($1::text[], $2::text[], interval '0')
),
handed AS (
    SELECT outbox_keys_advance(array_agg(queue), array_agg(ordering_key)) AS n
    FROM keys WHERE held IS NOT FALSE
    HAVING count(*) > 0
)
SELECT queue, ordering_key FROM keys
WHERE held IS FALSE AND (SELECT count(*) FROM handed) >= 0
