//! kill -9 of a worker with tasks in flight.

use std::time::Duration;

use outbox_tests::TestDb;
use outbox_tests::process::{WorkerProcess, wait_until};
use outbox_tests::tasks::{Record, create_executions_table};

use crate::WORKER;

const TASKS: i64 = 30;

/// A worker of the record queue that recovers a lost task quickly.
pub(crate) const FAST_RECOVERY: &[&str] = &[
    "--queue",
    "record=8",
    "--poll-interval",
    "100ms",
    "--heartbeat-interval",
    "100ms",
    "--heartbeat-timeout",
    "1s",
    "--maintenance-interval",
    "100ms",
];

#[tokio::test]
async fn a_killed_workers_tasks_are_recovered_and_none_is_lost() {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    outbox::submit_batch(
        &mut *db.conn().await,
        (0..TASKS).map(|_| Record { ms: 400 }),
    )
    .await
    .unwrap();

    let mut first = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    let in_flight = first.kill_mid_flight(&db.pool, 8, 4).await;
    assert!(in_flight >= 1, "the kill caught tasks in flight");

    let mut second = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    wait_until(
        &db.pool,
        "SELECT count(*) = 30 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(60),
    )
    .await;
    assert!(
        second.is_running(),
        "the second worker keeps running:\n{}",
        second.log()
    );

    let executions: i64 = sqlx::query_scalar("SELECT count(*) FROM executions")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let never_ran: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_all_tasks t WHERE NOT EXISTS (SELECT 1 FROM executions e WHERE e.task_id = t.id)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let recovered: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_all_tasks WHERE retry_count = 1 AND last_error LIKE 'worker lost (heartbeat expired)%'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let duplicates = executions - TASKS;
    eprintln!(
        "kill -9: {in_flight} tasks in flight at the kill; afterwards {TASKS} of {TASKS} COMPLETED, \
         {recovered} recovered, {executions} executions, {duplicates} duplicate executions"
    );
    assert_eq!(never_ran, 0, "every task ran");
    assert_eq!(
        recovered, in_flight,
        "each task in flight at the kill was recovered once, as a counted attempt"
    );
    assert!(
        duplicates <= in_flight,
        "duplicates ({duplicates}) at most the tasks in flight ({in_flight})"
    );
}
