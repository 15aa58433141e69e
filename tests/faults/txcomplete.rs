//! Transactional completion (`TaskContext::complete_in`) with the worker
//! killed just before and just after its COMMIT: the handler's effect is
//! written exactly once, and a task whose completion committed never runs
//! again.

use std::time::Duration;

use outbox_tests::TestDb;
use outbox_tests::process::{WorkerProcess, wait_until};
use outbox_tests::tasks::{Ship, create_shipments_table};

use crate::WORKER;

/// A worker that recovers a lost task quickly.
const FAST_RECOVERY: &[&str] = &[
    "--queue",
    "ship=4",
    "--heartbeat-interval",
    "200ms",
    "--heartbeat-timeout",
    "1s",
    "--maintenance-interval",
    "200ms",
];

async fn crash_at(point: &str) -> (i64, String, i32) {
    let db = TestDb::migrated().await;
    create_shipments_table(&db.pool).await;
    let id = outbox::submit(
        &mut *db.conn().await,
        Ship {
            order_id: 7,
            crash: point.to_owned(),
        },
    )
    .await
    .unwrap();
    // Its row says it is alive for three of its heartbeat intervals after
    // it dies, and recovery waits for that too: the same fast settings.
    let mut first = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    let status = first.wait(Duration::from_secs(30)).await;
    assert!(
        !status.success(),
        "the handler killed its worker: {status:?}"
    );
    let after_crash: String =
        sqlx::query_scalar("SELECT state::text FROM outbox_all_tasks WHERE id = $1")
            .bind(id.0)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    eprintln!("txcomplete: killed {point} COMMIT; the task is now {after_crash}");

    let mut second = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    wait_until(
        &db.pool,
        &format!(
            "SELECT state = 'completed' FROM outbox_all_tasks WHERE id = {}",
            id.0
        ),
        Duration::from_secs(30),
    )
    .await;
    // Give recovery time to act on anything left PROCESSING (several
    // heartbeat timeouts): a committed completion must not be re-run.
    tokio::time::sleep(Duration::from_secs(3)).await;
    second.signal("TERM");
    second.wait(Duration::from_secs(20)).await;
    let shipments: i64 = sqlx::query_scalar("SELECT count(*) FROM shipments")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let attempts: i32 = sqlx::query_scalar("SELECT max(attempt) FROM shipments")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    (shipments, after_crash, attempts)
}

#[tokio::test]
async fn killed_before_commit_the_effect_rolls_back_and_is_written_once_by_the_retry() {
    let (shipments, after_crash, attempts) = crash_at("before").await;
    assert_eq!(
        after_crash, "processing",
        "the completion rolled back with the effect"
    );
    assert_eq!(shipments, 1, "written once");
    assert_eq!(attempts, 2, "by the second attempt");
}

#[tokio::test]
async fn killed_after_commit_the_task_is_done_and_never_runs_again() {
    let (shipments, after_crash, attempts) = crash_at("after").await;
    assert_eq!(
        after_crash, "completed",
        "completion and effect committed together"
    );
    assert_eq!(shipments, 1);
    assert_eq!(attempts, 1, "no re-run after the commit");
}
