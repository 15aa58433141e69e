//! Periodic tasks with three worker processes, the maintenance leader
//! killed mid-schedule: every tick is enqueued exactly once, and the ticks
//! go on under the new leader.

use std::time::Duration;

use outbox_tests::TestDb;
use outbox_tests::process::{WorkerProcess, wait_until};

use crate::WORKER;
use crate::leader::{kill_the_leader, wait_for_one_leader};

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
    kill_the_leader(&mut workers, leader).await;
    let successor = wait_for_one_leader(&db, Some(leader)).await;
    wait_for_ticks(&db, before + 3).await;
    for w in &mut workers {
        w.signal("TERM");
        w.wait(Duration::from_secs(20)).await;
        // Every worker declares the same task: a follower checking the
        // leader's declarations, through the kill and the takeover, finds
        // nothing to warn of.
        assert!(
            !w.log()
                .contains("are not declared so by the maintenance leader"),
            "{}",
            w.log()
        );
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

/// `every 1s` at the default maintenance interval (5 s, so most ticks fall
/// between rounds), the leader killed a few ticks into the window: every
/// tick of a 10 s window runs once, and how soon after its time each
/// started is printed (a figure, not a bound: this machine is shared).
#[tokio::test]
async fn every_second_at_the_default_interval_runs_every_tick_once_through_a_killed_leader() {
    const WINDOW: i64 = 10;
    let args = [
        "--queue",
        "default=4",
        "--periodic",
        "tick=every 1s outbox.noop {}",
    ];
    let db = TestDb::migrated().await;
    let mut workers: Vec<WorkerProcess> = (0..3)
        .map(|_| WorkerProcess::spawn(WORKER, &db.url, &args))
        .collect();
    let leader = wait_for_one_leader(&db, None).await;
    let start: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT date_trunc('second', now()) + interval '2 seconds'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let end = start + chrono::TimeDelta::seconds(WINDOW);
    let done_in_window = |n: i64| {
        format!(
            "SELECT count(DISTINCT execute_at) >= {n} FROM outbox_all_tasks \
             WHERE task_type = 'outbox.noop' AND state = 'completed' \
               AND execute_at >= '{}' AND execute_at < '{}'",
            start.to_rfc3339(),
            end.to_rfc3339()
        )
    };
    wait_until(&db.pool, &done_in_window(3), Duration::from_secs(60)).await;
    kill_the_leader(&mut workers, leader).await;
    wait_until(&db.pool, &done_in_window(WINDOW), Duration::from_secs(60)).await;
    let successor = wait_for_one_leader(&db, Some(leader)).await;
    for w in &mut workers {
        w.terminate_within(Duration::from_secs(20)).await;
    }
    let duplicated: Vec<(i64, i64)> = ticks(&db)
        .await
        .into_iter()
        .filter(|(_, n)| *n != 1)
        .collect();
    assert!(
        duplicated.is_empty(),
        "ticks enqueued more than once: {duplicated:?}"
    );
    let late_ms: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM attempted_at - execute_at)::float8 * 1000 \
         FROM outbox_all_tasks WHERE task_type = 'outbox.noop' \
           AND execute_at >= $1 AND execute_at < $2 ORDER BY execute_at",
    )
    .bind(start)
    .bind(end)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        late_ms.len() as i64,
        WINDOW,
        "one task per tick of the window"
    );
    let mut sorted = late_ms.clone();
    sorted.sort_by(f64::total_cmp);
    eprintln!(
        "periodic every 1s, maintenance every 5s, leader pid {leader} killed, pid {successor} took over: \
         {WINDOW} of {WINDOW} ticks ran once; started after their time by median {:.0} ms, max {:.0} ms \
         (each: {:?})",
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1],
        late_ms
            .iter()
            .map(|ms| ms.round() as i64)
            .collect::<Vec<_>>()
    );
}

/// The only worker, the leader, black-holed for longer than its lease and
/// then let through again: no other worker took over, so it takes its own
/// lease back. That begins a leadership again, and it declares its periodic
/// tasks again: a `periodic delete` made while the lease had run out (no
/// live leader declared the task) is undone, and the ticks go on, each
/// once.
#[tokio::test]
async fn a_leader_black_holed_past_its_lease_takes_it_back_and_declares_again() {
    let db = TestDb::migrated().await;
    let (proxy, proxied) = outbox_tests::proxy::FaultProxy::start(&db.url).await;
    let mut worker = WorkerProcess::spawn(WORKER, &proxied, ARGS);
    wait_for_ticks(&db, 2).await;
    proxy.blackhole();
    // Its lease (1 s at rounds of 100 ms) runs out.
    wait_until(
        &db.pool,
        "SELECT bool_and(expires_at <= now()) FROM outbox_leases WHERE name = 'maintenance'",
        Duration::from_secs(30),
    )
    .await;
    let deleted = outbox::periodic::delete(&db.pool, "tick", false)
        .await
        .unwrap();
    assert!(
        matches!(deleted, outbox::periodic::PeriodicDeletion::Deleted { .. }),
        "{deleted:?}"
    );
    proxy.pass();
    wait_until(
        &db.pool,
        "SELECT EXISTS (SELECT 1 FROM outbox_periodic WHERE name = 'tick')",
        Duration::from_secs(60),
    )
    .await;
    let before = ticks(&db).await.len();
    wait_for_ticks(&db, before + 2).await;
    worker.signal("TERM");
    worker.wait(Duration::from_secs(20)).await;
    let all = ticks(&db).await;
    let duplicated: Vec<_> = all.iter().filter(|(_, n)| *n != 1).collect();
    assert!(
        duplicated.is_empty(),
        "ticks enqueued more than once: {duplicated:?}"
    );
    eprintln!(
        "periodic: the leader black-holed past its lease, its declaration deleted meanwhile: \
         declared again on its return, {} ticks in all, none twice",
        all.len()
    );
}
