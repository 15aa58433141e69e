-- TX2 fast path: the usual outcome, success, for a batch of attempts, with
-- only ids and claims to send. Fenced like finish_tasks.sql. A successful
-- task leaves outbox_tasks for the history (migration 10 says why); a task
-- an operator asked to cancel ends dead instead, and one whose uniqueness
-- covers COMPLETED stays here, completed, holding its unique key.
-- $1 id bigint[], $2 claims int[], $3 claim token text[], $4 clock
-- override (tests).
--
-- A key let go of may go straight on to its next task, claimed here for
-- this worker (migration 17 says when): $5 the queues with free places
-- text[], $6 how many in each int[], $7 the claim token of that hand-on
-- (null: none). Rows with handed false are the outcomes written (cancelled
-- true for a task an operator's cancel made dead instead, migration 29);
-- rows with handed true are tasks handed their key, claimed says whether
-- for us.
-- A key is waited for 50 ms at most: a key that another transaction holds
-- for longer (an application's open submit of the key, say) is not handed
-- on here but returned in deferred_key (with its queue), and the worker
-- hands it on in a statement of its own (migrations 23 and 26).
--
-- The statement itself is outbox_complete_tasks (migration 26), which plans
-- it once per session.
SELECT id, handed, claimed, queue, task_type, payload, retry_count, max_attempts, claims,
       key_seq, created_at, trace_context, ordered, workflow_id, deferred_key, run_halted,
       cancelled
FROM outbox_complete_tasks($1::bigint[], $2::int[], $3::text[], $4::timestamptz, $5::text[],
                           $6::int[], $7::text, false, $8::bigint[],
                           $9::timestamptz[], $10::bigint[])
