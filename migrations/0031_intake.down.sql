-- Back to migration 30. No submit may write to the intake from here on
-- (one that committed after the move below would be dropped with the
-- table), and its tasks move into outbox_tasks first: none is lost.
LOCK TABLE outbox_intake IN ACCESS EXCLUSIVE MODE;
SELECT outbox_take_intake_ids(ARRAY(SELECT id FROM outbox_intake));

CREATE OR REPLACE VIEW outbox_all_tasks AS
SELECT id, task_type, queue, payload, state, priority, retry_count, max_attempts, claims,
       execute_at, created_at, updated_at, claimed_by, heartbeat_at, finished_at, dead_at,
       last_error, unique_key, unique_states, result, cancel_requested_at, ordering_key,
       key_seq, blocked, skip_dead, attempted_at
FROM outbox_tasks
UNION ALL
SELECT id, task_type, queue, payload, 'completed'::outbox_task_state, priority, retry_count,
       max_attempts, claims, execute_at, created_at, finished_at, NULL::text, NULL::timestamptz,
       finished_at, NULL::timestamptz, last_error, unique_key, NULL::smallint, result,
       NULL::timestamptz, ordering_key, key_seq, false, false, attempted_at
FROM outbox_task_history;

DROP FUNCTION outbox_claim_limited(text, bigint, text, timestamptz, bigint);
DROP FUNCTION outbox_claim_tasks(text, bigint, text, timestamptz, smallint, timestamptz, bigint,
                                 timestamptz, bigint, integer, bigint);
DROP FUNCTION outbox_claim_limited(text, bigint, text, timestamptz);
DROP FUNCTION outbox_claim_tasks(text, bigint, text, timestamptz, smallint, timestamptz, bigint,
                                 timestamptz, bigint, integer);
ALTER FUNCTION outbox_claim_limited_body(text, bigint, text, timestamptz)
    RENAME TO outbox_claim_limited;
ALTER FUNCTION outbox_claim_tasks_body(text, bigint, text, timestamptz, smallint, timestamptz,
                                       bigint, timestamptz, bigint, integer)
    RENAME TO outbox_claim_tasks;
DROP FUNCTION outbox_take_intake_ids(bigint[], text);
DROP FUNCTION outbox_take_intake(bigint, bigint, text);
DROP TABLE outbox_intake;
