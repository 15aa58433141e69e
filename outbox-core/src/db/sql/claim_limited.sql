-- TX1 of a queue with a global concurrency or a rate: takes the queue's
-- row, then claims at most what the limits allow now.
-- Running tasks are counted afresh (the claim's snapshot is taken after
-- the lock, so it sees every claim committed before it); the rate is
-- a token bucket in the queue's row, refilled by the time since it was
-- last used, holding at most a tenth of a second's worth (at least one).
-- Nothing is claimed while paused.
-- attempted_at is clock_timestamp(): after the lock wait and this
-- statement's snapshot, so after the finished_at of every outcome that
-- freed a slot (statement_timestamp() can precede a commit the snapshot
-- sees).
-- Returns the claimed tasks, each with `allowed` (what the limits let this
-- claim take), and one row with a null id when it claimed nothing, so the
-- caller can tell a queue held back by its limits from an empty one.
--
-- The statement itself is outbox_claim_limited (migration 26): one call,
-- planned once per session. $1 queue, $2 how many at most, $3 claim
-- token, $4 clock override (tests), $5: first, up to 1,000 tasks of the
-- intake (migration 31) with ids above this one (none when null) are
-- moved into outbox_tasks, whatever their queue; `intake_to` is the
-- highest id moved.
SELECT id, task_type, queue, payload, retry_count, max_attempts, claims, ordered, key_seq,
       created_at, trace_context, workflow_id, allowed, intake_to
FROM outbox_claim_limited($1::text, $2::bigint, $3::text, $4::timestamptz, $5::bigint)
