-- TX2 fast path with a retention of zero: successful tasks are deleted at
-- once instead of being kept as COMPLETED history. Fenced like
-- finish_tasks.sql. A task an operator asked to cancel is kept, dead, as
-- the record of the cancel. $1 id bigint[], $2 claims int[], $3 claim
-- token text[], $4 clock override (tests; for the hand-on only). $5-$7 and
-- the rows returned: the hand-on, as in complete_tasks.sql.
--
-- The statement itself is outbox_complete_tasks (migration 26), which plans
-- it once per session.
SELECT id, handed, claimed, queue, task_type, payload, retry_count, max_attempts, claims,
       key_seq, created_at, trace_context, ordered, workflow_id, deferred_key, run_halted,
       cancelled
FROM outbox_complete_tasks($1::bigint[], $2::int[], $3::text[], $4::timestamptz, $5::text[],
                           $6::int[], $7::text, true, $8::bigint[],
                           $9::timestamptz[], $10::bigint[])
