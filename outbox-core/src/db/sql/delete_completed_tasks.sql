-- TX2 fast path with a retention of zero: successful tasks are deleted at
-- once instead of being kept as COMPLETED history. Fenced like
-- finish_tasks.sql. $1 id bigint[], $2 claims int[], $3 claim token
-- text[].
DELETE FROM outbox_tasks AS t
USING unnest($1::bigint[], $2::int[], $3::text[]) AS o(id, claims, token)
WHERE t.id = o.id
  AND t.claims = o.claims
  -- The claim token is unique to the claim statement (only PROCESSING rows
  -- have one: a CHECK constraint says so). Testing claimed_by rather than
  -- state keeps the planner from walking outbox_tasks_processing_idx and
  -- re-scanning the batch for every row.
  AND t.claimed_by = o.token
RETURNING t.id
