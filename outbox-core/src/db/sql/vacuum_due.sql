-- Whether the task table needs a vacuum now: its dead row versions and live
-- rows (the statistics collector's estimates, up to a second behind), and
-- whether this role may vacuum it (its owner, a member of the owning role,
-- or a superuser; VACUUM skips the table with a warning otherwise).
SELECT coalesce(s.n_dead_tup, 0) AS dead,
       coalesce(s.n_live_tup, 0) AS live,
       pg_has_role(c.relowner, 'USAGE')
           OR coalesce((SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = current_user), false)
           AS may_vacuum
FROM pg_class AS c
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = 'outbox_tasks'::regclass
