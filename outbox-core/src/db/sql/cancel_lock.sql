-- The first statement of an operator cancel (cancel_tasks.sql is the
-- second, in the same transaction): locks the ordering keys of the tasks
-- it may hand on (those not running), then the tasks, in id order, so
-- that the cancel's updates, in a statement (and a snapshot) of their
-- own, judge each task by the state it has under the lock. Keys come
-- first: a hand-over locks a key and then writes its next tasks, so a
-- cancel that wrote a waiting task first and locked its key after could
-- deadlock with it. A running task's key is not taken: its cancel hands
-- nothing on, and the statements that end a running task (its outcome,
-- recovery) lock the task before its key. (A locking CTE in the
-- cancel's own statement is not enough: PostgreSQL checks an updated
-- row's constraints on the row built from the version the statement's
-- snapshot saw, before it finds the newer version and builds the row
-- again from that, so the cancel of a task failed for a retry while the
-- cancel waited was refused, a dead row with its old claim holder
-- breaking the table's checks.) $1 ids.
WITH waiting AS (
    -- The keyed tasks judged waiting: not running, not claimed, not held by
    -- a run without a write (migration 56). Their keys are locked here,
    -- and cancel_tasks.sql makes only these dead at once ($2): one judged
    -- running here is asked to cancel there, even if its run has ended in
    -- between (it may be in the line a claim is reading now).
    SELECT t.id, t.queue, t.ordering_key FROM outbox_tasks AS t
    WHERE t.id = ANY($1::bigint[]) AND t.ordering_key IS NOT NULL
      AND t.state <> 'processing' AND t.claimed_by IS NULL
      AND NOT (t.blocked AND t.state = 'pending'
               AND outbox_run_claim(t.queue, t.ordering_key, t.key_seq) IS NOT NULL)
),
keys AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (SELECT w.queue, w.ordering_key FROM waiting AS w)
        ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
        FOR UPDATE OF o) AS l
)
SELECT id, ordering_key IS NULL OR id IN (SELECT w.id FROM waiting AS w) AS waiting
FROM outbox_tasks
WHERE id = ANY($1::bigint[])
  AND (SELECT n FROM keys) >= 0
ORDER BY id
FOR UPDATE
