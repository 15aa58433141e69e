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
    kill_and_recover(false).await;
}

/// The same beside a snapshot held open from before the first claim to
/// after the last outcome: the claimable index keeps every entry, the
/// survivor claims from its floor, and the recovered tasks still run.
#[tokio::test]
async fn a_killed_workers_tasks_are_recovered_beside_a_held_snapshot() {
    kill_and_recover(true).await;
}

async fn kill_and_recover(hold_snapshot: bool) {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    outbox::submit_batch(
        &mut *db.conn().await,
        (0..TASKS).map(|_| Record { ms: 400 }),
    )
    .await
    .unwrap();
    let mut holder = db.conn().await;
    if hold_snapshot {
        sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox_tasks")
            .execute(&mut *holder)
            .await
            .unwrap();
    }

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
    if hold_snapshot {
        // Still the one snapshot, from before the first claim: it sees
        // every task pending.
        let pending: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_tasks WHERE state = 'pending' AND claims = 0",
        )
        .fetch_one(&mut *holder)
        .await
        .unwrap();
        assert_eq!(pending, TASKS, "the snapshot stayed open all along");
        sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
    }
    eprintln!(
        "kill -9 (snapshot held: {hold_snapshot}): {in_flight} tasks in flight at the kill; \
         afterwards {TASKS} of {TASKS} COMPLETED, {recovered} recovered, {executions} executions, \
         {duplicates} duplicate executions"
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

#[tokio::test]
async fn a_killed_workers_durable_steps_are_not_run_again() {
    use outbox_tests::tasks::TwoSteps;
    const N: i64 = 24;
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    outbox::submit_batch(&mut *db.conn().await, (0..N).map(|_| TwoSteps { ms: 600 }))
        .await
        .unwrap();
    let mut first = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    // Killed once 4 tasks recorded their first step and work towards the
    // second (600 ms each).
    wait_until(
        &db.pool,
        "SELECT count(*) >= 4 FROM outbox_durable_steps WHERE name = 'first'",
        Duration::from_secs(30),
    )
    .await;
    let in_flight = first.kill_mid_flight(&db.pool, 0, 1).await;
    let recorded: Vec<i64> = sqlx::query_scalar(
        "SELECT d.task_id FROM outbox_durable_steps d WHERE d.name = 'first' \
         AND NOT EXISTS (SELECT 1 FROM outbox_durable_steps s WHERE s.task_id = d.task_id AND s.name = 'second')",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let recorded_first = recorded.len();
    let mut second = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    wait_until(
        &db.pool,
        &format!("SELECT count(*) = {N} FROM outbox_all_tasks WHERE state = 'completed'"),
        Duration::from_secs(90),
    )
    .await;
    assert!(second.is_running(), "{}", second.log());
    let runs: Vec<(i32, i64, i64)> = sqlx::query_as(
        "SELECT attempt, count(*), count(DISTINCT task_id) FROM executions GROUP BY attempt ORDER BY attempt",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    eprintln!(
        "durable kill -9: {in_flight} tasks in flight, {recorded_first} first steps recorded at the kill; \
         afterwards {N} of {N} completed, executions per step (step, runs, tasks): {runs:?}"
    );
    // Every step of every task ran, and a step cut between its work and
    // its record ran again at most once per task in flight; a recorded
    // first step never ran again (below).
    assert_eq!(runs.len(), 2);
    for (step, executions, tasks) in &runs {
        assert_eq!(*tasks, N, "step {step}");
        assert!(*executions - N <= in_flight, "step {step}: {runs:?}");
    }
    assert!(
        recorded_first >= 1,
        "the kill caught tasks between their steps"
    );
    let rerun: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT task_id FROM executions WHERE attempt = 1 AND task_id = ANY($1) \
         GROUP BY task_id HAVING count(*) > 1) AS twice",
    )
    .bind(&recorded)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(rerun, 0, "a recorded first step ran again");
}
