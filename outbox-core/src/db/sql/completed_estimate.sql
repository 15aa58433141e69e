-- How many completed tasks there are, estimated from the planner's
-- statistics instead of counted (a count would read the whole history on
-- every page load): the row counts of the history's partitions, plus the
-- completed tasks outbox_tasks still holds (row count times the share of
-- 'completed' in the state column's most common values). 0 before the
-- first ANALYZE.
SELECT (coalesce((
    SELECT sum(greatest(c.reltuples, 0))
    FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'outbox_task_history'::regclass
), 0) + greatest(coalesce((
    SELECT c.reltuples * coalesce((
        SELECT m.freq
        FROM pg_stats s,
             unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS m(val, freq)
        WHERE s.schemaname = n.nspname AND s.tablename = c.relname
          AND s.attname = 'state' AND m.val = 'completed'
    ), 0)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = 'outbox_tasks'::regclass
), 0), 0))::bigint
