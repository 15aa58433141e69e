-- TX2: write the outcomes of a batch of attempts in one statement.
-- Each outcome is fenced on the claim it belongs to: if the task was
-- recovered and claimed again meanwhile (or the claim was lost in a server
-- crash and the task claimed anew), claims or the claim token has moved on
-- and the stale outcome changes nothing. A task an operator asked to cancel
-- (cancel_requested_at) ends dead whatever the outcome says. A successful
-- task moves to the history with its result, unless its uniqueness covers
-- COMPLETED (it stays here, holding its unique key; see complete_tasks.sql).
-- $1 id bigint[], $2 claims int[], $3 claim token text[], $4 new state
-- text[] ('completed', 'failed' or 'pending'), $5 add to retry_count int[],
-- $6 delay before the next attempt in microseconds bigint[], $7 dead
-- bool[], $8 error text[] (null keeps the previous one). $9 overrides the
-- clock (tests). $10 result text[] (JSON; null keeps none).
-- Returns the ids written (cancelled true for a task an operator's cancel
-- made dead whatever its outcome said, migration 29), and (with a null id)
-- each ordering key let go of whose row another transaction held for
-- longer than 50 ms: it is handed on by the worker in a statement of its
-- own (migrations 23 and 26; complete_tasks.sql says why).
--
-- The statement itself is outbox_finish_tasks (migration 26), which plans
-- it once per session.
SELECT id, queue, deferred_key, run_halted, cancelled
FROM outbox_finish_tasks($1::bigint[], $2::int[], $3::text[], $4::text[], $5::int[],
                         $6::bigint[], $7::bool[], $8::text[], $9::timestamptz, $10::text[],
                         $11::timestamptz[], $12::bigint[], $13::bigint[])
