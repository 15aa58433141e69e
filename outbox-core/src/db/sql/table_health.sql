-- What keeps the task table lean or lets it bloat: its dead row versions
-- (the statistics collector's estimate), and the oldest snapshot a session
-- of this database holds. While a snapshot is open, vacuum cannot remove
-- any row version that died after it was taken, so every claim's SKIP
-- LOCKED scan wades through more of them. A transaction that wrote
-- something holds the horizon back by its own id too, even between
-- statements at READ COMMITTED. Sessions of other roles show no
-- snapshot unless this role may read all statistics (pg_read_all_stats).
-- Autovacuum's own snapshot does not hold other vacuums back.
SELECT
    coalesce((SELECT n_dead_tup FROM pg_stat_user_tables
               WHERE relid = 'outbox_tasks'::regclass), 0) AS dead_tuples,
    coalesce((SELECT n_live_tup FROM pg_stat_user_tables
               WHERE relid = 'outbox_tasks'::regclass), 0) AS live_tuples,
    oldest.age_s AS oldest_snapshot_age_s,
    oldest.holder AS oldest_snapshot_holder
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT extract(epoch FROM now() - coalesce(xact_start, query_start, backend_start))::float8 AS age_s,
           format('pid %s (%s, %s): %s', pid,
                  coalesce(nullif(application_name, ''), usename::text, backend_type),
                  coalesce(state, 'unknown'), left(coalesce(query, ''), 120)) AS holder
    FROM pg_stat_activity
    WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
      AND pid <> pg_backend_pid()
      AND backend_type <> 'autovacuum worker'
      AND (datname IS NULL OR datname = current_database())
    ORDER BY coalesce(xact_start, query_start, backend_start)
    LIMIT 1
) AS oldest ON true
