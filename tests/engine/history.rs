//! The history: successful tasks leave outbox_tasks for a table partitioned
//! by finish time, every operator view still sees them, retention drops
//! whole partitions, and an upgrade from the single-table schema keeps
//! every row.

use std::time::Duration;

use chrono::{Duration as Days, Utc};
use outbox::admin::{self, Reason, TaskFilter};
use outbox::{
    Clock, HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, TaskOptions, Unique,
    Worker, WorkerConfig, outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::Connection;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[outbox_task(task_type = "test.history.sum", queue = "history")]
struct Sum {
    a: i64,
    b: i64,
}

struct Adder;

impl TaskHandler<Sum> for Adder {
    async fn handle(&self, _ctx: TaskContext, task: Sum) -> HandlerResult {
        Outcome::success_with(&(task.a + task.b))
    }
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[outbox_task(task_type = "test.history.plain", queue = "history")]
struct Plain {
    n: i64,
}

struct Nothing;

impl TaskHandler<Plain> for Nothing {
    async fn handle(&self, _ctx: TaskContext, _task: Plain) -> HandlerResult {
        Ok(Outcome::Success)
    }
}

async fn scalar(db: &TestDb, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn worker(db: &TestDb, config: WorkerConfig) -> Worker {
    Worker::builder(db.pool.clone())
        .config(config)
        .handler::<Sum>(Adder)
        .handler::<Plain>(Nothing)
        .queue("history", 4)
        .build()
        .unwrap()
}

/// A worker whose clock stands at `at`, with no maintenance to make
/// partitions for it: its tasks finish where no partition exists.
fn worker_at(db: &TestDb, at: chrono::DateTime<Utc>) -> Worker {
    worker(
        db,
        WorkerConfig {
            maintenance: false,
            clock: Clock::fixed(at),
            ..WorkerConfig::default()
        },
    )
}

#[tokio::test]
async fn a_successful_task_moves_to_the_history_and_every_view_still_sees_it() {
    let db = TestDb::migrated().await;
    let sum = outbox::submit(&mut *db.conn().await, Sum { a: 2, b: 3 })
        .await
        .unwrap();
    let plain = outbox::submit_batch(&mut *db.conn().await, (0..3).map(|n| Plain { n }))
        .await
        .unwrap();
    let mut running = RunningWorker::start(worker(&db, WorkerConfig::default()));
    running
        .wait_for(TaskEventKind::Completed, 4, Duration::from_secs(20))
        .await;
    running.stop().await;

    // Out of the table claims scan, into the history: nothing deleted.
    assert_eq!(scalar(&db, "SELECT count(*) FROM outbox_tasks").await, 0);
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_task_history").await,
        4
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_task_history_default").await,
        0,
        "today's partition was made ahead (by the migration and the leader)"
    );

    // tasks show, with its result.
    let record = admin::get_task(&db.pool, sum).await.unwrap().unwrap();
    assert_eq!(record.state, "completed");
    assert_eq!(record.result, Some(serde_json::json!(5)));
    assert_eq!(record.payload, serde_json::json!({"a": 2, "b": 3}));
    assert!(record.finished_at.is_some() && record.claimed_by.is_none());
    let typed: Option<i64> = outbox::result(&mut *db.conn().await, sum).await.unwrap();
    assert_eq!(typed, Some(5));

    // tasks list, newest first, and by state.
    let page = admin::search_tasks(
        &db.pool,
        &TaskFilter {
            state: Some("completed".into()),
            ..TaskFilter::default()
        },
    )
    .await
    .unwrap();
    let listed: Vec<i64> = page.tasks.iter().map(|t| t.id).collect();
    let mut expected: Vec<i64> = plain.iter().map(|t| t.0).chain([sum.0]).collect();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(listed, expected);

    // stats.
    let counts = admin::count_by_type_and_state(&db.pool).await.unwrap();
    let completed: i64 = counts
        .iter()
        .filter(|c| c.state == "completed")
        .map(|c| c.count)
        .sum();
    assert_eq!(completed, 4, "{counts:?}");

    // tasks explain.
    let explained = admin::explain_task(&db.pool, plain[0])
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            explained.reasons.as_slice(),
            [Reason::Completed {
                finished_at: Some(_)
            }]
        ),
        "{:?}",
        explained.reasons
    );

    // The testing helpers.
    let seen = outbox::testing::submitted::<Plain>(&mut *db.conn().await).await;
    assert_eq!(seen.len(), 3);
}

#[tokio::test]
async fn retention_drops_whole_partitions_and_deletes_no_row() {
    let db = TestDb::migrated().await;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let day = Duration::from_secs(86_400);
    // Ten days ago the leader made that day's partitions (and two ahead).
    let then = Utc::now() - Days::days(10);
    let created = outbox::maintenance::prepare_history(&mut conn, day, &Clock::fixed(then))
        .await
        .unwrap();
    assert_eq!(created, 3, "the day ten days ago and the two after it");
    // A day of completed tasks then, and a few today.
    sqlx::query(
        "INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count, \
                                          max_attempts, claims, execute_at, created_at, finished_at) \
         SELECT n, 'x', 'history', '{}', 0, 0, 1, 1, $1, $1, $1 + (n % 1000) * interval '1 second' \
         FROM generate_series(1, 5000) AS n",
    )
    .bind(then)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox_task_history (id, task_type, queue, payload, priority, retry_count, \
                                          max_attempts, claims, execute_at, created_at, finished_at) \
         SELECT n, 'x', 'history', '{}', 0, 0, 1, 1, now(), now(), now() \
         FROM generate_series(5001, 5005) AS n",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let old_partition: String = sqlx::query_scalar(
        "SELECT DISTINCT tableoid::regclass::text FROM outbox_task_history WHERE id <= 5000",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_ne!(old_partition, "outbox_task_history_default");

    let report =
        outbox::maintenance::cleanup_completed(&mut conn, 7 * day, 1000, &Clock::database())
            .await
            .unwrap();
    assert_eq!(report.deleted, 0, "no row deleted: {report:?}");
    assert!(
        report.partitions_dropped.contains(&old_partition),
        "{report:?}"
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_task_history").await,
        5,
        "today's tasks stay"
    );
    let gone: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(&old_partition)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(gone, None, "the partition itself is gone");
}

#[tokio::test]
async fn tasks_finished_where_no_partition_exists_wait_in_the_default_partition_until_one_is_made()
{
    let db = TestDb::migrated().await;
    // A worker whose clock is a year and a half ahead, and no maintenance to
    // make partitions for it: its tasks finish where none exists.
    let later = Utc::now() + Days::days(550);
    let ids = outbox::submit_batch(&mut *db.conn().await, (0..5).map(|n| Plain { n }))
        .await
        .unwrap();
    let mut running = RunningWorker::start(worker_at(&db, later));
    running
        .wait_for(TaskEventKind::Completed, 5, Duration::from_secs(20))
        .await;
    running.stop().await;
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_task_history_default").await,
        5,
        "no outcome fails for want of a partition"
    );
    assert_eq!(
        admin::get_task(&db.pool, ids[0])
            .await
            .unwrap()
            .unwrap()
            .state,
        "completed"
    );

    // The partition made for that time takes them over.
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let created = outbox::maintenance::prepare_history(
        &mut conn,
        Duration::from_secs(3600),
        &Clock::fixed(later),
    )
    .await
    .unwrap();
    assert_eq!(created, 3, "hourly: this hour and the two after it");
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_task_history_default").await,
        0
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_task_history").await,
        5
    );

    // A width out of range is refused before anything is written.
    let err =
        outbox::maintenance::prepare_history(&mut conn, Duration::from_secs(1), &Clock::database())
            .await
            .unwrap_err();
    assert!(
        err.to_string().contains("use a minute to 366 days"),
        "{err}"
    );
}

#[tokio::test]
async fn a_unique_task_that_covers_completed_stays_live_and_holds_its_key() {
    let db = TestDb::migrated().await;
    let once = || TaskOptions::new().unique(Unique::key("once").including_completed());
    let first = outbox::submit_detailed(&mut *db.conn().await, Plain { n: 1 }, once())
        .await
        .unwrap();
    let mut running = RunningWorker::start(worker(&db, WorkerConfig::default()));
    running
        .wait_for(TaskEventKind::Completed, 1, Duration::from_secs(20))
        .await;
    running.stop().await;
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM outbox_tasks WHERE state = 'completed'"
        )
        .await,
        1,
        "its unique index lives on outbox_tasks"
    );
    let again = outbox::submit_detailed(&mut *db.conn().await, Plain { n: 2 }, once())
        .await
        .unwrap();
    assert!(again.duplicate && again.id == first.id, "{again:?}");

    // Past the retention, cleanup deletes it and the key is free.
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let report =
        outbox::maintenance::cleanup_completed(&mut conn, Duration::ZERO, 100, &Clock::database())
            .await
            .unwrap();
    assert_eq!(report.deleted, 1);
    let third = outbox::submit_detailed(&mut *db.conn().await, Plain { n: 3 }, once())
        .await
        .unwrap();
    assert!(!third.duplicate);
}

/// The columns every version of the schema has, as operators see them.
const ROWS: &str = "SELECT id, task_type, queue, payload::text, \
       CASE WHEN dead_at IS NOT NULL THEN 'dead' ELSE state::text END, \
       retry_count, claims, last_error, result::text, finished_at, unique_key, ordering_key \
       FROM {table} ORDER BY id";

type Row = (
    i64,
    String,
    String,
    String,
    String,
    i32,
    i32,
    Option<String>,
    Option<String>,
    Option<chrono::DateTime<Utc>>,
    Option<String>,
    Option<String>,
);

#[tokio::test]
async fn an_upgrade_from_the_single_table_schema_keeps_every_row() {
    let db = TestDb::empty().await;
    outbox::migrate_to(&db.pool, 9).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, state, finished_at, result, claims)
         SELECT 'x', 'q', jsonb_build_object('n', n), 3, 'completed', now() - n * interval '1 day', '{\"ok\": true}', 1
         FROM generate_series(1, 20) AS n;
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, state, finished_at, claims,
                                   unique_key, unique_states)
         VALUES ('x', 'q', '{\"u\": 1}', 3, 'completed', now(), 1, 'x:u1', 15);
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, retry_count, state,
                                   finished_at, dead_at, last_error, claims)
         VALUES ('x', 'q', '{\"dead\": 1}', 1, 1, 'failed', now(), now(), 'boom', 1);
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, state, claimed_by,
                                   heartbeat_at, claims)
         VALUES ('x', 'q', '{\"running\": 1}', 3, 'processing', 'w1', now(), 1);
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, ordering_key)
         VALUES ('x', 'q', '{\"k\": 1}', 3, 'acct-1'), ('x', 'q', '{\"k\": 2}', 3, 'acct-1');",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let before: Vec<Row> =
        sqlx::query_as(sqlx::AssertSqlSafe(ROWS.replace("{table}", "outbox_tasks")))
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(before.len(), 25);

    // Version 10 moves the rows; later versions must leave them as they are.
    let report = outbox::migrate(&db.pool).await.unwrap();
    assert_eq!(
        report.applied,
        (10..=outbox::latest_version()).collect::<Vec<_>>()
    );
    let after: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(
        ROWS.replace("{table}", "outbox_all_tasks"),
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(after, before, "every row, as it was");
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_task_history").await,
        20
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_task_history_default").await,
        0,
        "each moved row found a partition of its day"
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_tasks").await,
        5,
        "live, dead, and the completed one that holds its unique key"
    );
    // The waiting task of the key still waits behind the first one.
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_tasks WHERE blocked").await,
        1
    );
}

#[tokio::test]
async fn a_partition_made_while_outcomes_land_in_the_default_partition_takes_them_all_over() {
    const TASKS: usize = 3_000;
    let db = TestDb::migrated().await;
    let later = Utc::now() + Days::days(550);
    outbox::submit_batch(
        &mut *db.conn().await,
        (0..TASKS as i64).map(|n| Plain { n }),
    )
    .await
    .unwrap();
    let mut running = RunningWorker::start(worker_at(&db, later));
    // Outcomes are landing in the default partition: make the partition
    // for their time now, while more keep coming.
    outbox_tests::process::wait_until(
        &db.pool,
        "SELECT count(*) >= 200 FROM outbox_task_history_default",
        Duration::from_secs(20),
    )
    .await;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut refused = Vec::new();
    let created = loop {
        // A lock not granted within 100 ms is refused; the leader would try
        // again next round.
        match outbox::maintenance::prepare_history(
            &mut conn,
            Duration::from_secs(3600),
            &Clock::fixed(later),
        )
        .await
        {
            Ok(n) => break n,
            Err(e) if refused.len() < 50 => refused.push(e.to_string()),
            Err(e) => panic!("never made: {e}; before: {refused:?}"),
        }
    };
    assert_eq!(created, 3, "{refused:?}");
    running
        .wait_for(TaskEventKind::Completed, TASKS, Duration::from_secs(60))
        .await;
    running.stop().await;
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_task_history_default").await,
        0,
        "every row moved, and none landed there after"
    );
    assert_eq!(
        db.count_by_state().await,
        vec![("completed".to_owned(), TASKS as i64)],
        "no outcome was refused"
    );
}
