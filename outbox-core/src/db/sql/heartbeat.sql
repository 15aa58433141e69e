-- One statement per interval for all of a worker's in-flight tasks (those
-- running and those whose outcome is not written yet). Only rows still held
-- under one of this worker's claim tokens are touched: a task recovered and
-- claimed by someone else is not kept alive by a worker that lost it.
-- $1 id bigint[], $2 this worker's live claim tokens text[], $3 overrides
-- the clock (tests). Returns the tasks still held (a task asked about and
-- missing is no longer this worker's: its handler must stop), each with
-- whether an operator asked to cancel it (the fallback for a cancel
-- NOTIFY the worker missed).
--
-- The rows are locked in id order, as the outcome statements lock theirs
-- (migration 26): an UPDATE alone locks them in whatever order its plan
-- reads them (a bitmap scan: their order on disk), and a heartbeat and an
-- outcome batch that took the same rows in different orders deadlocked.
-- The deadlock is found after a second, and the heartbeat it cancelled
-- came too late after an outage: recovery took the live tasks.
--
-- The UPDATE finds them by `id = ANY`, not by a join with `held`: with
-- statistics taken while the task table was empty, a join was planned
-- with the whole table outside and `held` read again for each of its rows
-- (migration 27). And `state = 'processing'` is written `IS TRUE`: in
-- that form it implies no partial index's predicate, so the rows are
-- found by primary key even under statistics that took the index of
-- running tasks for empty (a table analyzed while nothing ran), which
-- would otherwise be read whole (migration 34 says more).
--
-- The tasks of a run held in place are confirmed, not written: the run's
-- last task, PROCESSING, carries the run's heartbeat, and recovery takes
-- them back with it. Held under migration 43 they carry the claim; held
-- without a write (migration 56), their run's last task does.
WITH held AS (
    SELECT id
    FROM outbox_tasks
    WHERE id = ANY($1::bigint[])
      AND claimed_by = ANY($2::text[])
      AND (state = 'processing') IS TRUE
    ORDER BY id
    FOR UPDATE
),
beat AS (
    UPDATE outbox_tasks AS t
    SET heartbeat_at = coalesce($3::timestamptz, now())
    WHERE t.id = ANY (ARRAY(SELECT held.id FROM held))
    RETURNING t.id, t.cancel_requested_at IS NOT NULL AS cancel
)
SELECT id, cancel FROM beat
UNION ALL
SELECT id, cancel_requested_at IS NOT NULL
FROM outbox_tasks AS t
WHERE id = ANY($1::bigint[])
  AND (state = 'pending') IS TRUE
  AND (claimed_by = ANY($2::text[])
       OR t.claimed_by IS NULL AND t.blocked AND t.state = 'pending'
       AND outbox_run_claim(t.queue, t.ordering_key, t.key_seq) = ANY($2::text[]))
