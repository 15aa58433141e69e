//! The worker's statements find tasks by primary key whatever the planner
//! believes of the task table's size (migration 27).
//!
//! When autovacuum analyzed `outbox_tasks` while it was empty and its pages
//! stayed, the planner took the table for one row until the next analyze.
//! A statement that joined it by id with a short list (a claim's picks, an
//! outcome's batch, a heartbeat's tasks, recovery's finds) could then be
//! planned with the whole table read through its primary key and the list
//! read again for each of its rows: a drain of workflow steps fell from
//! about 20,000 to 1,700 steps/s, and outcome statements ran into their
//! timeout. Counted here: the primary key's entries and the rows of
//! sequential scans each of the worker's statements reads, with 5,000 rows
//! the statistics do not know about. And with statistics that take a
//! partial index for empty, no lookup by id reads that index whole
//! (migration 34).

use chrono::{DateTime, Duration, Utc};
use outbox_tests::TestDb;
use sqlx::{PgConnection, Row};

const HEARTBEAT: &str = include_str!("../../outbox-core/src/db/sql/heartbeat.sql");
const COMPLETE: &str = include_str!("../../outbox-core/src/db/sql/complete_tasks.sql");
const FINISH: &str = include_str!("../../outbox-core/src/db/sql/finish_tasks.sql");
const RECOVER: &str = include_str!("../../outbox-core/src/db/sql/recover_stuck.sql");
const COMPLETE_IN_TX: &str =
    include_str!("../../outbox-core/src/db/sql/complete_in_transaction.sql");
const CLAIM_LIMITED: &str = include_str!("../../outbox-core/src/db/sql/claim_limited.sql");
const RELEASE_RUN: &str = include_str!("../../outbox-core/src/db/sql/release_run.sql");
const CANCEL: &str = include_str!("../../outbox-core/src/db/sql/cancel_tasks.sql");

/// Fewer entries than one walk of the primary key (at least 10,000: the
/// 5,000 deleted rows' entries and the 5,000 live ones).
const BY_KEY: i64 = 1_000;

/// Entries of the task table's primary key, and rows of sequential scans
/// of the table, read so far in this transaction.
async fn key_reads(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT pg_stat_get_xact_tuples_returned('outbox_tasks_pkey'::regclass) \
              + pg_stat_get_xact_tuples_returned('outbox_tasks'::regclass)",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Claims up to `n` tasks of queue `lookups` under `token`, as the worker
/// does: their ids and claim counts.
async fn claim(conn: &mut PgConnection, n: i64, token: &str) -> Vec<(i64, i32)> {
    crate::claim_sql::claim(conn, "lookups", n, token, 1)
        .await
        .iter()
        .map(|r| (r.get::<i64, _>("id"), r.get::<i32, _>("claims")))
        .collect()
}

#[tokio::test]
async fn the_workers_statements_read_tasks_by_key_after_the_table_was_analyzed_empty() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    sqlx::raw_sql(
        // Analyzed empty, its pages kept (autovacuum would truncate them),
        // then filled behind the statistics' back.
        "ALTER TABLE outbox_tasks SET (autovacuum_enabled = false); \
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) \
         SELECT 'test.gone', 'lookups-gone', '{}', 1 FROM generate_series(1, 5000); \
         DELETE FROM outbox_tasks; \
         ANALYZE outbox_tasks; \
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, execute_at) \
         SELECT 'test.later', 'lookups-later', '{}', 1, now() + interval '1 year' \
         FROM generate_series(1, 5000); \
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) \
         SELECT 'test.now', 'lookups', '{}', 3 FROM generate_series(1, 31); \
         INSERT INTO outbox_queues (name, global_concurrency) VALUES ('lookups-limited', 10); \
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) \
         SELECT 'test.now', 'lookups-limited', '{}', 3 FROM generate_series(1, 30)",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let (tuples, pages): (f32, i32) = sqlx::query_as(
        "SELECT reltuples, relpages FROM pg_class WHERE oid = 'outbox_tasks'::regclass",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert!(tuples < 1.0 && pages > 0, "{tuples} rows in {pages} pages");

    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let mut reads = key_reads(&mut tx).await;
    let mut check = async |tx: &mut PgConnection, what: &str| {
        let now = key_reads(tx).await;
        let read = now - reads;
        reads = now;
        assert!(
            read < BY_KEY,
            "{what} read {read} entries of the task table's primary key or rows of a walk of it"
        );
    };

    let ids: Vec<i64> = claim(&mut tx, 20, "claim-a")
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids.len(), 20);
    check(&mut tx, "the claim").await;

    let held: Vec<i64> = sqlx::query(HEARTBEAT)
        .bind(&ids)
        .bind(vec!["claim-a"])
        .bind(None::<DateTime<Utc>>)
        .bind(0_i64)
        .fetch_all(&mut *tx)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<i64, _>("id"))
        .collect();
    assert_eq!(held.len(), 20);
    check(&mut tx, "the heartbeat").await;

    let (done, failed) = ids.split_at(10);
    let completed = sqlx::query(COMPLETE)
        .bind(done.to_vec())
        .bind(vec![1_i32; done.len()])
        .bind(vec!["claim-a"; done.len()])
        .bind(None::<DateTime<Utc>>)
        .bind(vec!["lookups"])
        .bind(vec![1_i32])
        .bind(Some("hand-on claim"))
        .bind(Vec::<i64>::new())
        .bind(vec![None::<DateTime<Utc>>; done.len()])
        .bind(Vec::<i64>::new())
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(completed.len(), 10);
    check(&mut tx, "the success outcome").await;

    let retried = sqlx::query(FINISH)
        .bind(failed.to_vec())
        .bind(vec![1_i32; failed.len()])
        .bind(vec!["claim-a"; failed.len()])
        .bind(vec!["pending"; failed.len()])
        .bind(vec![1_i32; failed.len()])
        .bind(vec![0_i64; failed.len()])
        .bind(vec![false; failed.len()])
        .bind(vec![Some("it failed"); failed.len()])
        .bind(None::<DateTime<Utc>>)
        .bind(vec![None::<String>; failed.len()])
        .bind(vec![None::<DateTime<Utc>>; failed.len()])
        .bind(Vec::<i64>::new())
        .bind(Vec::<i64>::new())
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(retried.len(), 10);
    check(&mut tx, "the failure outcome").await;

    // Tasks whose worker went silent: recovered an hour later.
    assert_eq!(claim(&mut tx, 20, "claim-b").await.len(), 20);
    check(&mut tx, "the second claim").await;
    let recovered = sqlx::query(RECOVER)
        .bind(1_000_000_i64)
        .bind(100_i64)
        .bind(Some(Utc::now() + Duration::hours(1)))
        .bind(None::<String>)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(recovered.len(), 20);
    check(&mut tx, "the recovery").await;

    let limited = sqlx::query(CLAIM_LIMITED)
        .bind("lookups-limited")
        .bind(20_i64)
        .bind("claim-c")
        .bind(None::<DateTime<Utc>>)
        .bind(0_i64)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(limited.len(), 10, "a global concurrency of 10");
    check(&mut tx, "the claim of a limited queue").await;

    // A handler that completes its task in its own transaction.
    let one = claim(&mut tx, 1, "claim-d").await;
    assert_eq!(one.len(), 1);
    check(&mut tx, "the third claim").await;
    let gone: Vec<i64> = sqlx::query_scalar(COMPLETE_IN_TX)
        .bind(one[0].0)
        .bind(one[0].1)
        .bind("claim-d")
        .bind(None::<String>)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(gone, [one[0].0]);
    check(&mut tx, "the completion in the handler's transaction").await;
    tx.rollback().await.unwrap();
}

/// The heartbeat, the release of a run's rest and an operator's cancel
/// find their few tasks by primary key even when the statistics took the
/// partial index their other conditions imply for empty: `state =
/// 'processing'` implies the running tasks' index, `dead_at IS NOT NULL`
/// the dead tasks'. Planned under statistics gathered while nothing ran or
/// had died (a table analyzed after a drain, or before any task failed),
/// each read that index whole and tested every entry against its ids
/// (migration 34 found the same in the claim and the outcomes).
#[tokio::test]
async fn statements_by_id_never_read_a_partial_index_whole_under_stale_statistics() {
    const OTHERS: i64 = 3000;
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    outbox_tests::tasks::stale_task_statistics(&db.pool, "lookups").await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, state, claimed_by, \
                                   heartbeat_at, claims) \
         SELECT 'test.running', 'lookups-other', '{{}}', 3, 'processing', 'other', now(), 1 \
         FROM generate_series(1, {OTHERS}); \
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, state, dead_at, \
                                   finished_at, ordering_key) \
         SELECT 'test.dead', 'lookups-other', '{{}}', 1, 'failed', now(), now(), 'k' || g \
         FROM generate_series(1, {OTHERS}) AS g"
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    // Twenty of this worker's running tasks, and twenty dead ones.
    let mine: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, state, claimed_by, \
                                   heartbeat_at, claims) \
         SELECT 'test.mine', 'lookups', '{}', 3, 'processing', 'mine', now(), 1 \
         FROM generate_series(1, 20) RETURNING id",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let dead: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, state, dead_at, \
                                   finished_at, ordering_key) \
         SELECT 'test.dead', 'lookups', '{}', 1, 'failed', now(), now(), 'mine' || g \
         FROM generate_series(1, 20) AS g RETURNING id",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();

    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let mut fetched = outbox_tests::tasks::task_index_fetches(&mut tx).await;
    let mut check = async |tx: &mut PgConnection, what: &str| {
        let now = outbox_tests::tasks::task_index_fetches(tx).await;
        let read = now - fetched;
        fetched = now;
        assert!(
            read < OTHERS / 4,
            "{what} fetched {read} rows through indexes beside {OTHERS} running and {OTHERS} dead \
             tasks"
        );
    };

    let held = sqlx::query(HEARTBEAT)
        .bind(&mine[..10])
        .bind(vec!["mine"])
        .bind(None::<DateTime<Utc>>)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(held.len(), 10);
    check(&mut tx, "the heartbeat").await;

    let released = sqlx::query(RELEASE_RUN)
        .bind(&mine[..10])
        .bind(vec!["mine"; 10])
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert!(!released.is_empty(), "the run's rest went back");
    check(&mut tx, "the release of a run's rest").await;

    let mut asked = mine[10..].to_vec();
    asked.extend(&dead);
    let cancelled: Vec<i64> = sqlx::query_scalar(CANCEL)
        .bind(&asked)
        .bind(&asked)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(
        cancelled.len(),
        30,
        "ten asked to stop, twenty dead skipped"
    );
    check(&mut tx, "an operator's cancel").await;
    tx.rollback().await.unwrap();
}
