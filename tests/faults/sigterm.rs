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
            "--shutdown-grace",
            "2s",
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
        "SELECT id, state::text, retry_count, claimed_by, execute_at <= now() FROM outbox_tasks ORDER BY id",
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
