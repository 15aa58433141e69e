-- Insert one task: the common single submit, when no queue needs a NOTIFY
-- (see wakeup.rs). Plain VALUES, with no arrays to unnest and no CTE: the
-- cheapest statement the row can be written with, since it runs inside
-- the caller's own transaction. $1 task_type, $2 queue, $3 payload (JSON
-- text), $4 priority, $5 max_attempts, $6 run_at (null = not set), $7
-- delay in microseconds (null = not set), $8 ordering key (null = none),
-- $9 skip_dead. Keep in step with insert_tasks.sql.
INSERT INTO outbox_tasks (task_type, queue, payload, priority, max_attempts, execute_at,
                          ordering_key, skip_dead)
VALUES ($1, $2, $3::jsonb, $4, $5,
        coalesce($6::timestamptz, now() + coalesce($7::bigint, 0) * interval '1 microsecond'),
        $8, $9)
RETURNING id
