-- Seconds from the last part of fan-in workflow $1 completing to its chord
-- completing, by the database's clock (the steps' finished_at).
SELECT extract(epoch FROM
    (SELECT finished_at FROM outbox_workflow_steps WHERE workflow_id = $1 AND name = 'chord')
    - (SELECT max(finished_at) FROM outbox_workflow_steps WHERE workflow_id = $1 AND name <> 'chord'))::float8
