-- Whether the task table needs a vacuum now: its dead row versions and live
-- rows (the statistics collector's estimates, up to a second behind), and
-- whether this role may vacuum it (the table's owner or a member of the
-- owning role, superusers included; VACUUM skips the table with a warning
-- for anyone else).
SELECT coalesce(s.n_dead_tup, 0) AS dead,
       coalesce(s.n_live_tup, 0) AS live,
       pg_has_role(c.relowner, 'USAGE') AS may_vacuum
FROM pg_class AS c
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = 'outbox_tasks'::regclass
