-- A slow walk of queue $1's claimable index found its first task at ($2,
-- $3, $4) in the claim order, took $5 ms and ended $6 seconds ago
-- (migration 35). A hint: the commit need not wait for its flush.
WITH lazy AS (SELECT set_config('synchronous_commit', 'off', true))
INSERT INTO outbox_claim_fronts (queue, priority, execute_at, id, walk_ms, walked_at)
SELECT $1, $2, $3, $4, $5, now() - make_interval(secs => $6) FROM lazy
ON CONFLICT (queue) DO UPDATE
SET priority = excluded.priority,
    execute_at = excluded.execute_at,
    id = excluded.id,
    walk_ms = excluded.walk_ms,
    walked_at = excluded.walked_at
