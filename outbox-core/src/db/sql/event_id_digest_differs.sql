-- Whether event id $1, recorded before, was recorded for another event
-- than aggregate type $2, aggregate id $3, type $4 and payload $5
-- (outbox_event_digest). False when they match, and when the id has no
-- digest (recorded before migration 38, or by the SQL function's `once`
-- before migration 40): then nothing is compared. (At REPEATABLE READ and SERIALIZABLE, an id
-- committed after the snapshot makes the claim itself fail with 40001.)
SELECT coalesce(digest <> outbox_event_digest($2::text, $3::text, $4::text, $5::jsonb), false)
FROM outbox_event_ids WHERE id = $1::uuid
