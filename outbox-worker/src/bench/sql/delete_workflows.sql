-- Removes the workflows the benchmark wrote, with their steps and edges.
WITH gone AS (
    DELETE FROM outbox_workflows WHERE name IN ('bench', 'bench-fan-in') RETURNING id
),
steps AS (
    DELETE FROM outbox_workflow_steps WHERE workflow_id IN (SELECT id FROM gone)
)
DELETE FROM outbox_workflow_edges WHERE workflow_id IN (SELECT id FROM gone)
