//! SIGTERM with slow tasks in flight.

use std::time::Duration;

use outbox::{Batch, TaskId};
use outbox_tests::TestDb;
use outbox_tests::process::{WorkerProcess, wait_until};
use outbox_tests::tasks::{Record, create_executions_table};

use crate::WORKER;

#[tokio::test]
async fn sigterm_finishes_what_it_can_releases_the_rest_and_exits_0() {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    let mut batch = Batch::new();
    for ms in [300, 300, 300, 600_000, 600_000, 600_000] {
        batch.push(&Record { ms }).unwrap();
    }
    let ids = batch.submit(&mut *db.conn().await).await.unwrap();
    let (quick, slow): (Vec<TaskId>, Vec<TaskId>) = (ids[..3].to_vec(), ids[3..].to_vec());

    let mut worker = WorkerProcess::spawn(
        WORKER,
        &db.url,
        &[
            "--queue",
            "record=8",
            // Ample for the quick tasks' last 300 ms on a loaded machine;
            // the slow ones run until it ends.
            "--shutdown-grace",
            "10s",
            "--poll-interval",
            "100ms",
        ],
    );
    wait_until(
        &db.pool,
        "SELECT count(*) = 6 FROM executions",
        Duration::from_secs(30),
    )
    .await;
    worker.signal("TERM");
    let status = worker.wait(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "clean exit:\n{}", worker.log());

    let states: Vec<(i64, String, i32, Option<String>, bool)> = sqlx::query_as(
        "SELECT id, state::text, retry_count, claimed_by, execute_at <= now() FROM outbox_all_tasks ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    for (id, state, retries, claimed_by, due) in &states {
        if quick.contains(&TaskId(*id)) {
            assert_eq!(
                state, "completed",
                "task {id} finished within the grace period"
            );
        } else {
            assert!(slow.contains(&TaskId(*id)));
            assert_eq!(state, "pending", "task {id} was released");
            assert_eq!(*retries, 0, "releasing does not count an attempt");
            assert!(
                claimed_by.is_none() && *due,
                "task {id} is claimable again at once"
            );
        }
    }
    eprintln!(
        "SIGTERM: 3 quick tasks COMPLETED, 3 slow tasks released to PENDING (retry_count 0), exit code 0"
    );
}

#[tokio::test]
async fn sigterm_gives_claimed_ahead_tasks_back_at_once_while_handlers_finish() {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    // Ten quick tasks set the pace (20 starts a second on one slot), so the
    // worker claims ahead; then slow ones: one runs, the rest wait in the
    // buffer when SIGTERM comes.
    let mut batch = Batch::new();
    for i in 0..40 {
        batch
            .push(&Record {
                ms: if i < 10 { 50 } else { 600_000 },
            })
            .unwrap();
    }
    let ids = batch.submit(&mut *db.conn().await).await.unwrap();
    let first_slow = ids[10].0;

    let mut worker = WorkerProcess::spawn(
        WORKER,
        &db.url,
        &[
            "--queue",
            "record=1",
            "--claim-ahead",
            "20",
            "--claim-ahead-window",
            "10s",
            "--shutdown-grace",
            "30s",
            "--poll-interval",
            "100ms",
        ],
    );
    wait_until(
        &db.pool,
        "SELECT count(*) = 11 FROM executions",
        Duration::from_secs(30),
    )
    .await;
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks WHERE state = 'processing'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        held > 5,
        "one running and a buffer claimed ahead, got {held} held:\n{}",
        worker.log()
    );

    worker.signal("TERM");
    // The buffer comes back at once, not when the running task's grace
    // period ends (30 s, far beyond the wait, which a loaded machine may
    // need several seconds of); the running one is still held meanwhile.
    wait_until(
        &db.pool,
        "SELECT count(*) = 29 FROM outbox_all_tasks WHERE state = 'pending' AND claimed_by IS NULL",
        Duration::from_secs(25),
    )
    .await;
    let (running_state, retries): (String, i32) =
        sqlx::query_as("SELECT state::text, retry_count FROM outbox_all_tasks WHERE id = $1")
            .bind(first_slow)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        running_state, "processing",
        "its handler is still in its grace period"
    );
    assert_eq!(retries, 0);
    let never_ran: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_all_tasks t WHERE state = 'pending' AND retry_count = 0 \
         AND NOT EXISTS (SELECT 1 FROM executions e WHERE e.task_id = t.id)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(never_ran, 29, "given back without counting an attempt");

    // After the grace period the running one is cancelled and released.
    let status = worker.wait(Duration::from_secs(90)).await;
    assert_eq!(status.code(), Some(0), "clean exit:\n{}", worker.log());
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_all_tasks WHERE state = 'pending' AND claimed_by IS NULL",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(pending, 30, "every slow task is claimable again");
    eprintln!(
        "claim-ahead at SIGTERM: {held} held (1 running + buffer), buffer back to PENDING at \
         once, no attempt counted"
    );
}

/// One stop request delivered twice at once (GNU `timeout` without
/// `--foreground` signals the worker and then its process group) is one
/// request: a graceful stop and exit 0, not "second signal: exiting now".
#[tokio::test]
async fn a_sigterm_delivered_twice_at_once_is_one_graceful_stop() {
    let db = TestDb::migrated().await;
    let mut worker = WorkerProcess::spawn(
        WORKER,
        &db.url,
        &["--queue", "record=2", "--poll-interval", "100ms"],
    );
    wait_until(
        &db.pool,
        "SELECT count(*) = 1 FROM outbox_workers",
        Duration::from_secs(30),
    )
    .await;
    let pid = worker.pid().to_string();
    // One kill(1), two kill(2) calls back to back.
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid, &pid])
        .status()
        .expect("run kill");
    assert!(sent.success());
    let status = worker.wait(Duration::from_secs(60)).await;
    let log = worker.log();
    assert_eq!(status.code(), Some(0), "a graceful stop:\n{log}");
    assert!(!log.contains("second signal"), "{log}");
}

/// A second signal half a second or more after the first is an operator's
/// second request: the worker exits at once (exit 1) without waiting for
/// its slow task.
#[tokio::test]
async fn a_second_sigterm_after_half_a_second_exits_at_once() {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    outbox::submit(&mut *db.conn().await, Record { ms: 600_000 })
        .await
        .unwrap();
    let mut worker = WorkerProcess::spawn(
        WORKER,
        &db.url,
        &[
            "--queue",
            "record=2",
            "--shutdown-grace",
            "10m",
            "--poll-interval",
            "100ms",
        ],
    );
    wait_until(
        &db.pool,
        "SELECT count(*) = 1 FROM executions",
        Duration::from_secs(30),
    )
    .await;
    worker.signal("TERM");
    worker
        .wait_for_log("SIGTERM received", Duration::from_secs(30))
        .await;
    // Apart by more than the window in which a repeat is a copy.
    tokio::time::sleep(Duration::from_millis(600)).await;
    worker.signal("TERM");
    let status = worker.wait(Duration::from_secs(60)).await;
    let log = worker.log();
    assert_eq!(status.code(), Some(1), "exits at once:\n{log}");
    assert!(log.contains("second signal: exiting now"), "{log}");
}
