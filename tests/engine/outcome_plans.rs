//! The worker's outcome statements, and the claim of a limited queue, are
//! planned once per session, not once per call (migration 26).
//!
//! PostgreSQL plans a prepared statement afresh for each call while its
//! custom plans look cheaper than its generic plan by more than an
//! allowance for planning. For a batch of one outcome (a hot key, a single
//! failure) the outcome statements, written out in full, fell on the wrong
//! side of that line once the task table held rows: each call was planned
//! (about 0.6 ms) before it ran. They now call functions that keep one
//! generic plan, and the statement the worker prepares is only that call.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use outbox_tests::TestDb;
use sqlx::PgConnection;

const COMPLETE: &str = include_str!("../../outbox-core/src/db/sql/complete_tasks.sql");
const DELETE: &str = include_str!("../../outbox-core/src/db/sql/delete_completed_tasks.sql");
/// The two above as the worker sends them when it takes runs behind the
/// tasks it is handed (`db::complete_tasks`).
const COMPLETE_RUNS: &str = concat!(
    "WITH o AS MATERIALIZED (\n",
    include_str!("../../outbox-core/src/db/sql/complete_tasks.sql"),
    include_str!("../../outbox-core/src/db/sql/hand_on_runs.sql")
);
const DELETE_RUNS: &str = concat!(
    "WITH o AS MATERIALIZED (\n",
    include_str!("../../outbox-core/src/db/sql/delete_completed_tasks.sql"),
    include_str!("../../outbox-core/src/db/sql/hand_on_runs.sql")
);
const FINISH: &str = include_str!("../../outbox-core/src/db/sql/finish_tasks.sql");
const CLAIM_LIMITED: &str = include_str!("../../outbox-core/src/db/sql/claim_limited.sql");

/// Calls of each statement: five custom plans, then the plan cache decides.
const CALLS: usize = 10;

/// How the session's prepared statement `sql` was planned: (generic, custom).
async fn plans(conn: &mut PgConnection, sql: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
    )
    .bind(sql)
    .fetch_one(conn)
    .await
    .expect("the statement is prepared in this session")
}

async fn success_outcome(conn: &mut PgConnection, sql: &'static str, runs: Option<i32>) {
    // A batch of one attempt that is not there: the plan is the same.
    let query = sqlx::query(sql)
        .bind(vec![-1_i64])
        .bind(vec![1_i32])
        .bind(vec!["no such claim"])
        .bind(None::<DateTime<Utc>>)
        .bind(vec!["plans"])
        .bind(vec![1_i32])
        .bind(Some("hand-on claim"))
        .bind(Vec::<i64>::new())
        .bind(vec![None::<DateTime<Utc>>])
        .bind(Vec::<i64>::new());
    match runs {
        Some(run_length) => query.bind(run_length),
        None => query,
    }
    .fetch_all(conn)
    .await
    .unwrap();
}

async fn failure_outcome(conn: &mut PgConnection) {
    sqlx::query(FINISH)
        .bind(vec![-1_i64])
        .bind(vec![1_i32])
        .bind(vec!["no such claim"])
        .bind(vec!["failed"])
        .bind(vec![1_i32])
        .bind(vec![1_000_000_i64])
        .bind(vec![false])
        .bind(vec![Some("it failed")])
        .bind(None::<DateTime<Utc>>)
        .bind(vec![None::<String>])
        .bind(vec![None::<DateTime<Utc>>])
        .bind(Vec::<i64>::new())
        .bind(Vec::<i64>::new())
        .fetch_all(conn)
        .await
        .unwrap();
}

async fn limited_claim(conn: &mut PgConnection) {
    sqlx::query(CLAIM_LIMITED)
        .bind("plans-limited")
        .bind(1_i64)
        .bind("a claim")
        .bind(None::<DateTime<Utc>>)
        .bind(0_i64)
        .fetch_all(conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn outcome_statements_for_one_task_are_not_planned_per_call() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    // A table with rows, and statistics that say so: an index scan now
    // costs enough for the custom plan of a batch of one to look cheaper.
    sqlx::raw_sql(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) \
         SELECT 'plans.filler', 'plans-filler', '{}', 3 FROM generate_series(1, 20000); \
         INSERT INTO outbox_queues (name, global_concurrency) VALUES ('plans-limited', 2); \
         ANALYZE outbox_tasks",
    )
    .execute(&mut *conn)
    .await
    .unwrap();

    for _ in 0..CALLS {
        success_outcome(&mut conn, COMPLETE, None).await;
        success_outcome(&mut conn, DELETE, None).await;
        success_outcome(&mut conn, COMPLETE_RUNS, Some(16)).await;
        success_outcome(&mut conn, DELETE_RUNS, Some(16)).await;
        failure_outcome(&mut conn).await;
        limited_claim(&mut conn).await;
    }
    for (name, sql) in [
        ("complete_tasks", COMPLETE),
        ("delete_completed_tasks", DELETE),
        ("complete_tasks with runs", COMPLETE_RUNS),
        ("delete_completed_tasks with runs", DELETE_RUNS),
        ("finish_tasks", FINISH),
        ("claim_limited", CLAIM_LIMITED),
    ] {
        let (generic, custom) = plans(&mut conn, sql).await;
        assert_eq!(
            (generic, custom),
            (CALLS as i64 - 5, 5),
            "{name}: after five custom plans, every call uses the generic plan"
        );
    }
    // The statements those calls run inside the functions face the same
    // choice in PL/pgSQL's plan cache: each function settles it.
    let unsettled: Vec<String> = sqlx::query_scalar(
        "SELECT p.proname::text FROM pg_proc AS p \
         WHERE p.proname IN ('outbox_complete_tasks', 'outbox_finish_tasks', \
                             'outbox_claim_limited', 'outbox_keys_let_go', \
                             'outbox_hold_runs') \
           AND NOT coalesce('plan_cache_mode=force_generic_plan' = ANY (p.proconfig), false) \
         UNION ALL \
         SELECT name FROM unnest(ARRAY['outbox_complete_tasks', 'outbox_finish_tasks', \
                                       'outbox_claim_limited', 'outbox_keys_let_go', \
                                       'outbox_hold_runs']) AS name \
         WHERE NOT EXISTS (SELECT 1 FROM pg_proc WHERE proname = name)",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert!(
        unsettled.is_empty(),
        "functions missing or planning per call: {unsettled:?}"
    );
}

/// A limited queue's claim counts the queue's running tasks on the
/// processing index, where every task finished since the last vacuum left
/// a dead entry. A bitmap scan would visit each of them on every claim; a
/// plain index scan marks them dead the first time and skips them after.
#[tokio::test]
async fn a_limited_claim_skips_the_dead_entries_of_finished_tasks() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    // 3,000 tasks that ran and are gone, their index entries left behind.
    sqlx::raw_sql(
        "ALTER TABLE outbox_tasks SET (autovacuum_enabled = false); \
         INSERT INTO outbox_queues (name, global_concurrency) VALUES ('plans-limited', 5); \
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, state, claims, \
                                   claimed_by, heartbeat_at, attempted_at) \
         SELECT 'plans.ran', 'plans-limited', '{}', 3, 'processing', 1, 'gone', now(), now() \
         FROM generate_series(1, 3000); \
         DELETE FROM outbox_tasks WHERE queue = 'plans-limited'",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    // The first claim reads all 3,000 (it counts the running tasks on that
    // index) and marks them dead once no snapshot can see their tasks; the
    // claims after it skip them. With a bitmap scan every claim reads all
    // 3,000, however long this waits. The wait is for snapshots: in our
    // runs, other tests' transactions (in their own databases) held the
    // marking back for a moment.
    let entries_read = async |conn: &mut PgConnection| -> i64 {
        sqlx::query_scalar(
            "SELECT pg_stat_get_xact_tuples_returned('outbox_tasks_processing_idx'::regclass)",
        )
        .fetch_one(conn)
        .await
        .unwrap()
    };
    // The session's counts not yet reported include earlier transactions'
    // reads: a claim's are the difference, inside one transaction.
    let claim_reads = async |conn: &mut PgConnection| -> i64 {
        sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
        let before = entries_read(&mut *conn).await;
        limited_claim(&mut *conn).await;
        let read = entries_read(&mut *conn).await - before;
        sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.unwrap();
        read
    };
    let first = claim_reads(&mut conn).await;
    assert!(
        first >= 3000,
        "the first claim counts the running tasks on the processing index: read {first}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let read = claim_reads(&mut conn).await;
        if read < 100 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "claims still read {read} entries of the processing index for no running task"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
