-- What `tasks explain` needs besides the task's row, in one statement:
-- the first task holding the task's ordering key (if another does), how
-- many wait behind that key, the queue's settings and running count, the
-- live workers serving the queue, and how many due tasks are ahead of it
-- in its queue, the intake's included (counted up to 10,000), and
-- whether the worker that claimed it is alive (a claim token starts with
-- its worker's id and '/'; null when no worker's row is left), and the
-- workflow step it is. $1 task id.
WITH t AS (
    SELECT id, queue, ordering_key, priority, execute_at, skip_dead, claimed_by
    FROM outbox_all_tasks WHERE id = $1
)
SELECT
    t.skip_dead,
    -- The workflow step it is, while it is here (the history keeps no
    -- workflow): one lookup for both columns.
    wf.workflow_id,
    wf.workflow_step,
    (SELECT bool_or(w.expires_at > now()) FROM outbox_workers AS w
      WHERE left(t.claimed_by, length(w.id) + 1) = w.id || '/') AS claimer_alive,
    (SELECT h.id FROM outbox_tasks AS h
      WHERE h.queue = t.queue AND h.ordering_key = t.ordering_key
        AND h.ordering_key IS NOT NULL AND (NOT h.blocked OR h.state = 'processing')
        AND h.state <> 'completed'
        AND (h.dead_at IS NULL OR NOT h.skip_dead)
        AND h.id <> t.id
      ORDER BY h.key_seq LIMIT 1) AS key_holder,
    (SELECT count(*) FROM outbox_tasks AS w
      WHERE w.queue = t.queue AND w.ordering_key = t.ordering_key AND w.blocked
        -- Not the tasks of a run held in place: claimed (migration 43),
        -- or between where a run starts and its last task (migration 56),
        -- counted from the key's holders.
        AND w.claimed_by IS NULL)
      - (SELECT count(*)
         FROM outbox_tasks AS r
         JOIN outbox_tasks AS w
           ON w.queue = r.queue AND w.ordering_key = r.ordering_key AND w.blocked
          AND w.key_seq >= r.run_from AND w.key_seq < r.key_seq
          AND w.state = 'pending' AND w.claimed_by IS NULL
         WHERE r.queue = t.queue AND r.ordering_key = t.ordering_key
           AND (r.blocked AND r.state = 'processing') IS TRUE
           AND (NOT r.blocked OR r.state = 'processing') AND r.state <> 'completed'
           AND (r.dead_at IS NULL OR NOT r.skip_dead)) AS key_waiting,
    q.paused_at,
    q.global_concurrency,
    q.rate_per_second,
    (SELECT count(*) FROM outbox_tasks AS r
      WHERE r.queue = t.queue AND r.state = 'processing') AS running,
    (SELECT count(*) FROM outbox_workers AS w
      WHERE w.expires_at > now()
        AND w.queues @> jsonb_build_array(jsonb_build_object('queue', t.queue))) AS live_workers,
    (SELECT count(*) FROM (
        SELECT 1 FROM outbox_tasks AS c
        WHERE c.queue = t.queue
          AND c.state IN ('pending', 'failed') AND c.dead_at IS NULL AND NOT c.blocked
          AND c.execute_at <= now()
          AND (c.priority, c.execute_at, c.id) < (t.priority, t.execute_at, t.id)
        UNION ALL
        SELECT 1 FROM outbox_intake AS i
        WHERE i.queue = t.queue
          AND (i.priority, i.created_at, i.id) < (t.priority, t.execute_at, t.id)
        LIMIT 10000) AS a) AS ahead,
    now() AS now
FROM t
LEFT JOIN outbox_queues AS q ON q.name = t.queue
LEFT JOIN LATERAL (SELECT x.workflow_id, x.workflow_step FROM outbox_tasks AS x
                   WHERE x.id = t.id) AS wf ON true
