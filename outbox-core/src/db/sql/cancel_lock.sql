-- The first statement of an operator cancel (cancel_tasks.sql is the
-- second, in the same transaction): locks the ordering keys of the tasks
-- it may hand on (those not running), then the tasks, in id order, so
-- that the cancel's updates, in a statement (and a snapshot) of their
-- own, judge each task by the state it has under the lock. See
-- cancel_tasks.sql for why keys come first. (A locking CTE in the
-- cancel's own statement is not enough: on PostgreSQL 15 its updates then
-- built the task's new row from the version their snapshot saw, and a
-- task failed for a retry while the cancel waited came out dead with its
-- old claim holder, refused by the table's checks.) $1 ids.
WITH keys AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM outbox_keys AS o
        WHERE (o.queue, o.ordering_key) IN (
            SELECT t.queue, t.ordering_key FROM outbox_tasks AS t
            WHERE t.id = ANY($1::bigint[]) AND t.ordering_key IS NOT NULL
              AND t.state <> 'processing')
        ORDER BY o.queue COLLATE "C", o.ordering_key COLLATE "C"
        FOR UPDATE OF o) AS l
)
SELECT id
FROM outbox_tasks
WHERE id = ANY($1::bigint[])
  AND (SELECT n FROM keys) >= 0
ORDER BY id
FOR UPDATE
