-- Hands on ordering keys that outcomes let go of but could not take at
-- the time, another transaction holding their row (migration 23): each key
-- whose row it can take within 10 ms (a key without a row gets one) goes
-- to its next tasks (outbox_keys_let_go, which wakes their queues).
-- $1 queues text[], $2 keys text[]. Returns the keys not taken.
SELECT l.queue, l.deferred_key AS ordering_key
FROM outbox_keys_let_go($1::text[], $2::text[], interval '10 milliseconds', '{}'::text[],
                        '{}'::int[], NULL::text, NULL::timestamptz) AS l
WHERE l.deferred_key IS NOT NULL
