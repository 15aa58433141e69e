-- outbox_signal: outbox::signal from SQL (guide, section 12), so that a
-- service in another language, a trigger or psql can send the value a
-- task waits for in ctx.wait_for, in its own transaction. Sends signal
-- `name` with `value` to task `task`; the signal exists, and wakes the
-- task, only if that transaction commits, and the first signal of a name
-- wins. Returns whether it was recorded: not when the task was sent one of
-- that name already, has finished (completed, or gone from outbox_tasks)
-- or does not exist. A task that ran and is pending again (suspended in
-- wait_for or sleep, or snoozed) becomes due now and its queue's workers
-- are woken at commit; one that never ran keeps its run-at. A dead task
-- takes signals, for a retry. A task in the intake takes them where it is.
-- The Rust API sends its signals through this function too
-- (send_signal.sql).
CREATE FUNCTION outbox_signal(task bigint, name text, value jsonb DEFAULT 'null')
RETURNS boolean
LANGUAGE plpgsql
AS $$
-- The statement below names the columns task_id, name and value, and the
-- arguments by position.
#variable_conflict use_column
DECLARE
    recorded boolean;
BEGIN
    IF $2 IS NULL OR octet_length($2) NOT BETWEEN 1 AND 200 THEN
        PERFORM outbox_refuse(format(
            'outbox_signal: a signal name must be 1 to 200 bytes long, got %s',
            coalesce(octet_length($2), 0)));
    END IF;
    -- SQL's NULL is JSON's null, as the default.
    $3 := coalesce($3, 'null'::jsonb);
    IF octet_length($3::text) > 65536 THEN
        PERFORM outbox_refuse(format(
            'outbox_signal: signal %s: the value is %s bytes of JSON (the most kept is 65536)',
            quote_literal($2), octet_length($3::text)));
    END IF;
    WITH sent AS (
        INSERT INTO outbox_task_signals (task_id, name, value)
        SELECT $1, $2, $3
        WHERE EXISTS (SELECT 1 FROM outbox_tasks AS t WHERE t.id = $1 AND t.state <> 'completed')
           OR EXISTS (SELECT 1 FROM outbox_intake AS i WHERE i.id = $1)
        ON CONFLICT (task_id, name) DO NOTHING
        RETURNING task_id
    ),
    woken AS (
        UPDATE outbox_tasks AS t
        SET execute_at = least(t.execute_at, now())
        FROM sent
        WHERE t.id = sent.task_id AND t.state = 'pending' AND t.claims > 0
        RETURNING t.queue
    ),
    told AS (
        SELECT pg_notify('outbox_tasks', woken.queue) FROM woken
    )
    SELECT EXISTS (SELECT 1 FROM sent) AND (SELECT count(*) FROM told) >= 0 INTO recorded;
    RETURN recorded;
END
$$;
