-- What a keyed task costs PostgreSQL against an unkeyed one, statement by
-- statement, without a worker (PERFORMANCE.md, "Outcomes of runs joined
-- by id, and where the ordered drain's time goes").
--
-- The procedure claims tasks of a queue as a worker does
-- (outbox_claim_tasks: `heads` heads, each with up to `run_length - 1`
-- tasks behind it; an unkeyed queue's claim takes `heads * 16` tasks) and
-- writes their outcomes with outbox_complete_tasks, step by step: the
-- first task of every run in one batch, then the second, and so on, each
-- run's tasks but its last going on, every step committed. An unkeyed
-- queue's tasks go in batches of `heads`. It prints the claim's and the
-- outcomes' time per task. With pg_stat_statements loaded and
-- `pg_stat_statements.track = all`, the statements inside the functions
-- say where that time goes.
--
-- On a scratch database migrated by `outbox-worker migrate`:
--
--   INSERT INTO outbox_tasks (task_type, queue, payload, ordering_key, max_attempts)
--   SELECT 'outbox.noop', 'oq', '{}', 'k' || (g % 1000), 25
--   FROM generate_series(1, 200000) AS g;
--   INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts)
--   SELECT 'outbox.noop', 'uq', '{}', 25 FROM generate_series(1, 200000);
--   VACUUM ANALYZE outbox_tasks;
--   \i docs/diagnostics/run_costs.sql
--   CALL outbox_diag_run_costs('uq', 64, 15, 1);
--   CALL outbox_diag_run_costs('oq', 64, 15, 16);
--
-- It writes to the task table and its history as a worker would: never on
-- a database that serves anyone.
CREATE OR REPLACE PROCEDURE outbox_diag_run_costs(q text, heads int, rounds int, run_length int)
LANGUAGE plpgsql AS $$
DECLARE
    token text;
    claim_us float8 := 0;
    outcome_us float8 := 0;
    t0 timestamptz;
    tasks int := 0;
    statements int := 0;
    batch_ids bigint[];
    batch_claims int[];
    batch_tokens text[];
    batch_continuing bigint[];
    batch_nexts bigint[];
    batch_starts timestamptz[];
    steps int;
BEGIN
    FOR r IN 1..rounds LOOP
        token := 'diag/' || q || '/' || r || '/' || clock_timestamp()::text;
        t0 := clock_timestamp();
        DROP TABLE IF EXISTS diag_claimed;
        CREATE TEMP TABLE diag_claimed AS
        SELECT c.id, c.claims, c.ordering_key, c.key_seq
        FROM outbox_claim_tasks(q, CASE WHEN run_length > 1 THEN heads ELSE heads * 16 END,
                                token, NULL, (-1)::smallint, NULL, NULL, NULL, NULL,
                                run_length, NULL, true) AS c;
        claim_us := claim_us + extract(epoch FROM clock_timestamp() - t0) * 1e6;
        COMMIT;
        -- Each task's step: its place in its run (unkeyed: its batch), and
        -- the run's next task.
        DROP TABLE IF EXISTS diag_steps;
        CREATE TEMP TABLE diag_steps AS
        SELECT id, claims,
               CASE WHEN ordering_key IS NULL
                    THEN 1 + (row_number() OVER (ORDER BY id) - 1) / heads
                    ELSE row_number() OVER (PARTITION BY ordering_key ORDER BY key_seq) END AS step,
               CASE WHEN ordering_key IS NOT NULL
                    THEN lead(id) OVER (PARTITION BY ordering_key ORDER BY key_seq) END AS next
        FROM diag_claimed;
        COMMIT;
        SELECT max(step) INTO steps FROM diag_steps;
        FOR s IN 1..coalesce(steps, 0) LOOP
            SELECT array_agg(id ORDER BY id), array_agg(claims ORDER BY id),
                   array_agg(token ORDER BY id), array_agg(clock_timestamp() ORDER BY id)
            INTO batch_ids, batch_claims, batch_tokens, batch_starts
            FROM diag_steps WHERE step = s;
            SELECT coalesce(array_agg(id ORDER BY id), '{}'), coalesce(array_agg(next ORDER BY id), '{}')
            INTO batch_continuing, batch_nexts
            FROM diag_steps WHERE step = s AND next IS NOT NULL;
            IF run_length <= 1 THEN
                batch_starts := NULL;
            END IF;
            t0 := clock_timestamp();
            PERFORM count(*)
            FROM outbox_complete_tasks(batch_ids, batch_claims, batch_tokens, NULL, '{}'::text[],
                                       '{}'::int[], NULL, false, batch_continuing, batch_starts,
                                       batch_nexts);
            outcome_us := outcome_us + extract(epoch FROM clock_timestamp() - t0) * 1e6;
            tasks := tasks + cardinality(batch_ids);
            statements := statements + 1;
            COMMIT;
        END LOOP;
    END LOOP;
    RAISE NOTICE '% tasks=% outcome statements=% claim us/task=% outcome us/task=%',
        q, tasks, statements, round((claim_us / greatest(tasks, 1))::numeric, 2),
        round((outcome_us / greatest(tasks, 1))::numeric, 2);
END
$$;
