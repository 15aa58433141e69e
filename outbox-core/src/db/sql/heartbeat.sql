-- One statement per interval for all of a worker's in-flight tasks. Only
-- rows this worker still holds are touched: a task recovered and claimed by
-- someone else is not kept alive by a worker that lost it.
-- $1 id bigint[], $2 worker id, $3 overrides the clock (tests).
UPDATE outbox_tasks
SET heartbeat_at = coalesce($3::timestamptz, now())
WHERE id = ANY($1::bigint[])
  AND claimed_by = $2
  AND state = 'processing'
