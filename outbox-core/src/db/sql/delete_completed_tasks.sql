-- TX2 fast path with a retention of zero: successful tasks are deleted at
-- once instead of being kept as COMPLETED history. Fenced like
-- finish_tasks.sql. $1 id bigint[], $2 claims int[].
DELETE FROM outbox_tasks AS t
USING unnest($1::bigint[], $2::int[]) AS o(id, claims)
WHERE t.id = o.id
  AND t.claims = o.claims
  -- Only PROCESSING rows have a claim holder (a CHECK constraint says so).
  -- Testing claimed_by rather than state keeps the planner from walking
  -- outbox_tasks_processing_idx and re-scanning the batch for every row.
  AND t.claimed_by IS NOT NULL
RETURNING t.id
