-- Operator change of a queue's settings; a value left null keeps what the
-- queue has. $1 queue, $2 paused (true pauses, false resumes), $3 whether
-- to set the global concurrency, $4 to it (null = no limit), $5 whether to
-- set the rate, $6 to it (per second, null = no limit), $7 per-key
-- concurrency. Taking the row waits for claims in flight; every claim
-- after the commit sees the change. The queue's workers are woken (a
-- resumed queue is claimed at once).
WITH changed AS (
    INSERT INTO outbox_queues AS q (name, paused_at, global_concurrency, rate_per_second,
                                    per_key_concurrency)
    VALUES ($1,
            CASE WHEN $2::boolean THEN clock_timestamp() END,
            CASE WHEN $3::boolean THEN $4::integer END,
            CASE WHEN $5::boolean THEN $6::float8 END,
            coalesce($7::integer, 1))
    ON CONFLICT (name) DO UPDATE SET
        paused_at = CASE WHEN $2::boolean IS NULL THEN q.paused_at
                         -- The moment the row was taken (after the claims in
                         -- flight): every claim before it recorded an
                         -- earlier attempted_at.
                         WHEN $2::boolean THEN coalesce(q.paused_at, clock_timestamp()) END,
        global_concurrency = CASE WHEN $3::boolean THEN $4::integer ELSE q.global_concurrency END,
        rate_per_second = CASE WHEN $5::boolean THEN $6::float8 ELSE q.rate_per_second END,
        -- A new rate starts from a bucket of its own; the same rate set
        -- again keeps the bucket (a fresh one would grant a fresh burst).
        rate_tokens = CASE WHEN $5::boolean AND q.rate_per_second IS DISTINCT FROM $6::float8
                           THEN NULL ELSE q.rate_tokens END,
        rate_filled_at = CASE WHEN $5::boolean AND q.rate_per_second IS DISTINCT FROM $6::float8
                              THEN NULL ELSE q.rate_filled_at END,
        per_key_concurrency = coalesce($7::integer, q.per_key_concurrency),
        updated_at = now()
    RETURNING name, paused_at, global_concurrency, rate_per_second, per_key_concurrency, updated_at
)
SELECT changed.*, pg_notify('outbox_tasks', name) IS NULL AS notified FROM changed
