-- Test helper (testing::submitted): the tasks of type $1 the connection's
-- open transaction wrote, oldest first; on a connection outside a
-- transaction ($2 false), every task of that type in the database.
--
-- A row this transaction wrote (in a savepoint too) is the only kind whose
-- writer is still in progress and that it can see. Its xmin is a 32-bit
-- xid at or after the transaction's own (modulo 2^32): widened from there,
-- it names an xid that was assigned, which pg_xact_status can be asked
-- about. Rows from before the transaction's xid are not its own and are
-- not asked about. (A row frozen more than 2^31 transactions ago keeps its
-- raw xmin, which can read as "after": asked about, it may be a future xid
-- and fail the helper. A test database never lives that long.)
-- Tasks of this transaction are in outbox_tasks or the intake (a claim
-- moves only committed rows).
WITH me AS (
    -- Null until the transaction writes: then it wrote no task.
    SELECT pg_current_xact_id_if_assigned()::text::bigint AS top
),
written AS (
    SELECT t.id, t.payload::text AS payload, t.xmin::text::bigint AS x
    FROM outbox_tasks AS t WHERE t.task_type = $1
    UNION ALL
    SELECT i.id, i.payload::text, i.xmin::text::bigint
    FROM outbox_intake AS i WHERE i.task_type = $1
),
after_top AS (
    SELECT w.id, w.payload, (w.x - me.top % 4294967296 + 4294967296) % 4294967296 AS d, me.top
    FROM written AS w, me
    -- 0 to 2 are never a transaction's own (invalid, bootstrap, frozen).
    WHERE $2 AND w.x >= 3
)
SELECT id, payload FROM after_top
-- CASE: an xid from before the transaction's is never asked about.
WHERE CASE WHEN d < 2147483648
           THEN pg_xact_status((top + d)::text::xid8) = 'in progress'
           ELSE false END
UNION ALL
SELECT a.id, a.payload::text FROM outbox_all_tasks AS a
WHERE NOT $2 AND a.task_type = $1
ORDER BY id
