-- One bounded batch of dead-task retention (`WorkerConfig::dead_retention`,
-- off by default): dead tasks that died before it leave the table. Kept
-- however old:
-- * a dead task that holds its ordering key (not skipped: the key's later
--   tasks wait for an operator to retry, cancel or skip it; deleting it
--   would let them go on unseen);
-- * a workflow's step while its workflow is there (the workflow reads a
--   step whose row is gone as completed, and a dead step is what fails or
--   compensates it); the workflow's own retention deletes the workflow and
--   leaves its dead steps, which then go like any dead task.
-- A dead task whose unique key covered dead tasks frees the key.
-- Found through outbox_tasks_dead_idx (dead rows only, however few).
-- $1 retention in microseconds, $2 batch size, $3 clock override.
DELETE FROM outbox_tasks
WHERE id IN (
    SELECT t.id
    FROM outbox_tasks AS t
    WHERE t.dead_at IS NOT NULL
      AND t.dead_at < coalesce($3::timestamptz, now()) - $1 * interval '1 microsecond'
      AND (t.workflow_id IS NULL
           OR NOT EXISTS (SELECT 1 FROM outbox_workflows AS w WHERE w.id = t.workflow_id))
      AND (t.ordering_key IS NULL OR t.skip_dead)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
