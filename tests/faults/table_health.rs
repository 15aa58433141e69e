//! A long transaction elsewhere in the database: `stats`, the gauges and
//! the maintenance leader's warning name it.

use std::time::Duration;

use outbox::admin;
use outbox_tests::TestDb;
use outbox_tests::process::WorkerProcess;
use sqlx::Connection;

use crate::WORKER;

#[tokio::test]
async fn a_snapshot_held_open_elsewhere_is_reported_and_warned_about() {
    let db = TestDb::migrated().await;
    // Churn: dead row versions in the task table.
    sqlx::query(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) \
         SELECT 'test.churn', 'churn', '{}', 1 FROM generate_series(1, 500)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE outbox_tasks SET priority = 1 WHERE task_type = 'test.churn'")
        .execute(&db.pool)
        .await
        .unwrap();

    // A report left open in another session, holding its snapshot.
    let options: sqlx::postgres::PgConnectOptions = db.url.parse().unwrap();
    let mut report = sqlx::PgConnection::connect_with(&options.application_name("long-report"))
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox_tasks")
        .execute(&mut report)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let mut health = admin::queue_health(&db.pool).await.unwrap();
    for _ in 0..50 {
        if health.table.dead_tuples > 0 {
            break;
        }
        // The statistics reach the shared counters within a second or so.
        tokio::time::sleep(Duration::from_millis(100)).await;
        health = admin::queue_health(&db.pool).await.unwrap();
    }
    assert!(
        health.table.oldest_snapshot_age_s >= 1.0,
        "the open report is seen: {health:?}"
    );
    let holder = health
        .table
        .oldest_snapshot_holder
        .clone()
        .unwrap_or_default();
    assert!(holder.contains("long-report"), "named: {holder}");
    assert!(
        health.table.dead_tuples >= 500,
        "the update's old versions: {health:?}"
    );

    let mut worker = WorkerProcess::spawn(
        WORKER,
        &db.url,
        &[
            "--queue",
            "record=1",
            "--warn-snapshot-age",
            "1s",
            "--maintenance-interval",
            "100ms",
        ],
    );
    let log = worker
        .wait_for_log("held a snapshot for longer", Duration::from_secs(20))
        .await;
    assert!(log.contains("long-report"), "{log}");
    worker.signal("TERM");
    worker.wait(Duration::from_secs(30)).await;

    sqlx::raw_sql("COMMIT").execute(&mut report).await.unwrap();
    let after = admin::queue_health(&db.pool).await.unwrap();
    assert!(
        after
            .table
            .oldest_snapshot_holder
            .as_deref()
            .is_none_or(|h| !h.contains("long-report")),
        "gone once committed: {after:?}"
    );
    eprintln!(
        "long transaction: {:.1}s old, {} dead tuples, named in stats and in the leader's warning",
        health.table.oldest_snapshot_age_s, health.table.dead_tuples
    );
}
