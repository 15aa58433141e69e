//! Periodic tasks with three worker processes, the maintenance leader
//! killed mid-schedule: every tick is enqueued exactly once, and the ticks
//! go on under the new leader.

use std::time::Duration;

use outbox_tests::TestDb;
use outbox_tests::process::{WorkerProcess, wait_until};

use crate::WORKER;
use crate::leader::wait_for_one_leader;

const ARGS: &[&str] = &[
    "--queue",
    "default=4",
    "--maintenance-interval",
    "100ms",
    "--periodic",
    "tick=every 1s outbox.noop {}",
];

/// (tick, rows with that tick) for every tick enqueued so far.
async fn ticks(db: &TestDb) -> Vec<(i64, i64)> {
    sqlx::query_as(
        "SELECT extract(epoch FROM execute_at)::bigint AS tick, count(*) \
         FROM outbox_all_tasks WHERE task_type = 'outbox.noop' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

async fn wait_for_ticks(db: &TestDb, n: usize) {
    wait_until(
        &db.pool,
        &format!(
            "SELECT count(DISTINCT execute_at) >= {n} FROM outbox_all_tasks WHERE task_type = 'outbox.noop'"
        ),
        Duration::from_secs(30),
    )
    .await;
}

#[tokio::test]
async fn three_workers_enqueue_each_tick_once_and_a_killed_leader_is_replaced() {
    let db = TestDb::migrated().await;
    let mut workers: Vec<WorkerProcess> = (0..3)
        .map(|_| WorkerProcess::spawn(WORKER, &db.url, ARGS))
        .collect();
    let leader = wait_for_one_leader(&db, None).await;
    wait_for_ticks(&db, 3).await;
    let before = ticks(&db).await.len();
    let index = workers
        .iter()
        .position(|w| w.pid() == leader)
        .expect("the leader is one of ours");
    let mut dead = workers.remove(index);
    dead.signal("KILL");
    dead.wait(Duration::from_secs(10)).await;
    let successor = wait_for_one_leader(&db, Some(leader)).await;
    wait_for_ticks(&db, before + 3).await;
    for w in &mut workers {
        w.signal("TERM");
        w.wait(Duration::from_secs(20)).await;
    }
    let all = ticks(&db).await;
    let duplicated: Vec<_> = all.iter().filter(|(_, n)| *n != 1).collect();
    assert!(
        duplicated.is_empty(),
        "ticks enqueued more than once: {duplicated:?}"
    );
    let span = all.last().unwrap().0 - all.first().unwrap().0 + 1;
    eprintln!(
        "periodic: 3 workers, leader pid {leader} killed, pid {successor} took over: {} ticks over {span} s, none twice",
        all.len()
    );
    assert!(all.len() as i64 <= span, "at most one task per second");
    let records: Vec<(String, Option<chrono::DateTime<chrono::Utc>>)> =
        sqlx::query_as("SELECT name, last_tick FROM outbox_periodic")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].1.map(|t| t.timestamp()),
        Some(all.last().unwrap().0),
        "last_tick is the latest tick enqueued"
    );
}
