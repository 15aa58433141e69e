-- One statement per interval for all of a worker's in-flight tasks (those
-- running and those whose outcome is not written yet). Only rows still held
-- under one of this worker's claim tokens are touched: a task recovered and
-- claimed by someone else is not kept alive by a worker that lost it.
-- $1 id bigint[], $2 this worker's live claim tokens text[], $3 overrides
-- the clock (tests). Returns the tasks still held (a task asked about and
-- missing is no longer this worker's: its handler must stop), each with
-- whether an operator asked to cancel it (the fallback for a cancel
-- NOTIFY the worker missed).
UPDATE outbox_tasks
SET heartbeat_at = coalesce($3::timestamptz, now())
WHERE id = ANY($1::bigint[])
  AND claimed_by = ANY($2::text[])
  AND state = 'processing'
RETURNING id, cancel_requested_at IS NOT NULL AS cancel
