-- Operator retry of completed tasks in the history: each runs again, as
-- River's JobRetry and Oban's retry_job run a completed job again (a
-- webhook to deliver once more, an export to redo). The history row moves
-- back to outbox_tasks with its id, PENDING and due now, with a fresh
-- attempt budget and its claims count (fencing goes on from it); its
-- result and last error are not carried (the new run writes its own). A
-- task with an ordering key queues again at the end of its key's line
-- (the insert trigger gives it its new place); a unique one takes its key
-- again, covering the three live states, and dead ones if its type
-- declares so (the history keeps the key, not the states; a uniqueness
-- that covered completed tasks kept its task out of the history).
--
-- Not moved: a task whose unique key a live task holds (it would be the
-- duplicate its uniqueness forbids), and a workflow's completed step (the
-- history keeps no workflow: it would run outside its workflow, without
-- its parents' results; the steps table is read for it). $1 ids. Returns
-- the ids moved; their queues are notified.
WITH gone AS (
    DELETE FROM outbox_task_history AS h
    WHERE h.id = ANY ($1::bigint[])
      AND NOT EXISTS (SELECT 1 FROM outbox_workflow_steps AS s WHERE s.task_id = h.id)
      AND (h.unique_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM outbox_tasks AS o
            WHERE o.unique_key = h.unique_key
              AND outbox_unique_covers(o.unique_states, o.state, o.dead_at IS NOT NULL)))
    RETURNING h.id, h.task_type, h.queue, h.payload, h.priority, h.max_attempts, h.claims,
              h.created_at, h.unique_key, h.ordering_key, h.key_seq
),
revived AS (
    INSERT INTO outbox_tasks (id, task_type, queue, payload, priority, max_attempts, claims,
                              execute_at, created_at, unique_key, unique_states, ordering_key,
                              skip_dead)
    -- Its own id again (the column is GENERATED ALWAYS).
    OVERRIDING SYSTEM VALUE
    SELECT g.id, g.task_type, g.queue, g.payload, g.priority, g.max_attempts, g.claims, now(),
           g.created_at, g.unique_key,
           CASE WHEN g.unique_key IS NOT NULL THEN 7 | (coalesce(d.unique_states, 0) & 16) END,
           g.ordering_key, coalesce(d.skip_dead, false)
    FROM gone AS g
    LEFT JOIN outbox_task_types AS d ON d.task_type = g.task_type
    -- Tasks of one key retried together queue again in their old order.
    ORDER BY g.key_seq NULLS LAST, g.id
    RETURNING id, queue
)
SELECT r.id
FROM revived AS r
WHERE (SELECT count(pg_notify('outbox_tasks', q.queue))
       FROM (SELECT DISTINCT queue FROM revived) AS q) >= 0
