//! One maintenance leader at a time; killing it hands the role over once
//! its lease runs out.

use std::time::Duration;

use outbox_tests::TestDb;
use outbox_tests::process::WorkerProcess;

use crate::WORKER;

/// A lease of two seconds (two intervals): at 100 ms it was one second,
/// which a leader stalled by a loaded machine in its first, heaviest round
/// could let run out while the test sampled it.
const ARGS: &[&str] = &[
    "--queue",
    "record=1",
    "--maintenance-interval",
    "1s",
    "--poll-interval",
    "1s",
];

/// The OS pid of the worker holding the maintenance lease, if any.
pub(crate) async fn leaders(db: &TestDb) -> Vec<u32> {
    holders(db, "expires_at > now()").await
}

/// The OS pid the maintenance lease names, whether or not it has run out.
async fn holder(db: &TestDb) -> Option<u32> {
    holders(db, "true").await.pop()
}

async fn holders(db: &TestDb, filter: &str) -> Vec<u32> {
    let holders: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT holder FROM outbox_leases WHERE name = $1 AND {filter}"
    )))
    .bind(outbox::MAINTENANCE_LEASE)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    // The holder is "host:pid:random/run".
    holders
        .iter()
        .map(|n| {
            n.split(':')
                .nth(1)
                .and_then(|pid| pid.parse().ok())
                .expect("pid in the lease holder")
        })
        .collect()
}

pub(crate) async fn wait_for_one_leader(db: &TestDb, not: Option<u32>) -> u32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = leaders(db).await;
        if let [one] = now[..]
            && Some(one) != not
        {
            return one;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no single new leader: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn exactly_one_leader_among_three_and_the_role_moves_when_it_dies() {
    let db = TestDb::migrated().await;
    let mut workers: Vec<WorkerProcess> = (0..3)
        .map(|_| WorkerProcess::spawn(WORKER, &db.url, ARGS))
        .collect();
    let leader = wait_for_one_leader(&db, None).await;
    // While all three campaign every second, the role stays with one: the
    // lease row names it throughout (renewed late or not, nobody else
    // took it).
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(holder(&db).await, Some(leader), "one leader at a time");
    }
    kill_the_leader(&mut workers, leader).await;

    let successor = wait_for_one_leader(&db, Some(leader)).await;
    assert!(
        workers.iter().any(|w| w.pid() == successor),
        "a surviving worker took over"
    );
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(holder(&db).await, Some(successor));
    }
    for w in &mut workers {
        assert!(w.is_running(), "{}", w.log());
    }
    eprintln!(
        "leader: 3 workers, 1 leader (pid {leader}); killed it; pid {successor} took over; still 1 leader"
    );
}

/// Kills the worker process `leader` (a pid) with SIGKILL, takes it out of
/// `workers` and waits for it to be gone.
pub(crate) async fn kill_the_leader(workers: &mut Vec<WorkerProcess>, leader: u32) {
    let index = workers
        .iter()
        .position(|w| w.pid() == leader)
        .expect("the leader is one of ours");
    let mut dead = workers.remove(index);
    dead.signal("KILL");
    dead.wait(Duration::from_secs(10)).await;
}
