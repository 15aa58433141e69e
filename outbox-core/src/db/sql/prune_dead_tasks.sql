-- One bounded batch of dead-task retention (`WorkerConfig::dead_retention`,
-- off by default): dead tasks that died before it leave the table. Kept
-- however old:
-- * a dead task that holds its ordering key (not skipped: the key's later
--   tasks wait for an operator to retry, cancel or skip it; deleting it
--   would let them go on unseen);
-- * a workflow's step (its workflow reads a step whose row is gone as
--   completed, and a dead step is what fails or compensates it).
-- A dead task whose unique key covered dead tasks frees the key.
-- Found through outbox_tasks_dead_idx (dead rows only, however few).
-- $1 retention in microseconds, $2 batch size, $3 clock override.
DELETE FROM outbox_tasks
WHERE id IN (
    SELECT id
    FROM outbox_tasks
    WHERE dead_at IS NOT NULL
      AND dead_at < coalesce($3::timestamptz, now()) - $1 * interval '1 microsecond'
      AND workflow_id IS NULL
      AND (ordering_key IS NULL OR skip_dead)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
