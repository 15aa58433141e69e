-- TX1 of a queue with a global concurrency or a rate, after lock_queue.sql
-- in the same transaction: claims at most what the limits allow now.
-- Running tasks are counted afresh (this statement's snapshot is taken
-- after the lock, so it sees every claim committed before it); the rate is
-- a token bucket in the queue's row, refilled by the time since it was
-- last used, holding at most a tenth of a second's worth (at least one).
-- Parameters as in claim_tasks.sql. Nothing is claimed while paused.
-- attempted_at is clock_timestamp(): after the lock wait and this
-- statement's snapshot, so after the finished_at of every outcome that
-- freed a slot (statement_timestamp() can precede a commit the snapshot
-- sees).
-- Returns the claimed tasks, each with `allowed` (what the limits let this
-- claim take), and one row with a null id when it claimed nothing, so the
-- caller can tell a queue held back by its limits from an empty one.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
),
-- The bucket's clock is this statement's start (after the queue's lock was
-- granted), never earlier than its last refill: now() would be the
-- transaction's start, before the lock wait, and count refill time twice.
clock AS (
    SELECT coalesce($4::timestamptz, statement_timestamp()) AS now
),
q AS (
    SELECT global_concurrency,
           rate_per_second,
           CASE WHEN rate_per_second IS NOT NULL THEN
               least(greatest(1, rate_per_second / 10),
                     coalesce(rate_tokens, greatest(1, rate_per_second / 10))
                     + rate_per_second
                       * greatest(0, extract(epoch FROM clock.now - coalesce(rate_filled_at, clock.now)))::float8)
           END AS tokens,
           CASE WHEN rate_per_second IS NOT NULL THEN
               greatest(clock.now, coalesce(rate_filled_at, clock.now))
           END AS filled_at
    FROM outbox_queues, clock
    WHERE name = $1 AND paused_at IS NULL
),
running AS (
    SELECT count(*) AS n FROM outbox_tasks WHERE queue = $1 AND state = 'processing'
),
allowed AS (
    SELECT greatest(0, least($2,
                             coalesce(q.global_concurrency - running.n, $2),
                             coalesce(floor(q.tokens)::bigint, $2))) AS n
    FROM q, running
),
next AS (
    SELECT id
    FROM outbox_tasks
    WHERE queue = $1
      AND state IN ('pending', 'failed') AND dead_at IS NULL AND NOT blocked
      AND execute_at <= coalesce($4::timestamptz, now())
    ORDER BY priority, execute_at, id
    LIMIT coalesce((SELECT n FROM allowed), 0)
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE outbox_tasks AS t
    SET state = 'processing',
        claims = t.claims + 1,
        claimed_by = $3,
        heartbeat_at = coalesce($4::timestamptz, now()),
        attempted_at = coalesce($4::timestamptz, clock_timestamp()),
        updated_at = coalesce($4::timestamptz, now())
    FROM next, async_commit
    WHERE t.id = next.id
    RETURNING t.id, t.task_type, t.queue, t.payload::text AS payload,
              t.retry_count, t.max_attempts, t.claims,
          t.ordering_key IS NOT NULL AS ordered, t.key_seq, t.created_at, t.trace_context,
              t.workflow_id
),
spent AS (
    UPDATE outbox_queues
    SET rate_tokens = (SELECT tokens FROM q) - (SELECT count(*) FROM claimed),
        rate_filled_at = (SELECT filled_at FROM q)
    WHERE name = $1 AND (SELECT tokens FROM q) IS NOT NULL
)
SELECT c.*, a.n AS allowed
FROM allowed AS a
LEFT JOIN claimed AS c ON true
