//! Heartbeats, fencing, cleanup and wake-ups, in process (the tests that
//! kill processes are in tests/faults).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::{
    Clock, HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, Worker, WorkerConfig,
    outbox_task,
};
use outbox_tests::process::wait_until;
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::Connection;
use tokio::sync::{Semaphore, mpsc};

const WAIT: Duration = Duration::from_secs(20);

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "test.crash.gated", queue = "gated")]
struct Gated {}

/// Each attempt reports that it started, then waits for a permit from the
/// gate.
#[derive(Clone)]
struct Gate {
    started: mpsc::UnboundedSender<i64>,
    permits: Arc<Semaphore>,
}

impl Gate {
    fn new() -> (Self, mpsc::UnboundedReceiver<i64>) {
        let (started, rx) = mpsc::unbounded_channel();
        (
            Self {
                started,
                permits: Arc::new(Semaphore::new(0)),
            },
            rx,
        )
    }
}

impl TaskHandler<Gated> for Gate {
    async fn handle(&self, ctx: TaskContext, _task: Gated) -> HandlerResult {
        let _ = self.started.send(ctx.id().0);
        self.permits.acquire().await.expect("gate open").forget();
        Ok(Outcome::Success)
    }
}

/// A worker that neither heartbeats nor recovers on its own: the test
/// decides when a task is presumed lost.
fn quiet() -> WorkerConfig {
    WorkerConfig {
        heartbeat_interval: Duration::from_secs(3600),
        heartbeat_timeout: Duration::from_secs(7200),
        maintenance: false,
        ..WorkerConfig::default()
    }
}

fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap()
}

#[tokio::test]
async fn a_late_outcome_from_a_stale_attempt_changes_nothing() {
    let db = TestDb::migrated().await;
    let id = outbox::submit(&mut *db.conn().await, Gated {})
        .await
        .unwrap();
    let t0 = micros(Utc::now() + chrono::Duration::hours(1));
    let quiet = quiet();

    // Worker A claims the task at t0 and then hangs (a long GC pause, a
    // network partition): it stops heartbeating.
    let (gate, mut started) = Gate::new();
    let mut a = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(quiet.clone())
            .clock(Clock::fixed(t0))
            .handler::<Gated>(gate.clone())
            .build()
            .unwrap(),
    );
    assert_eq!(started.recv().await, Some(id.0));

    // Later, once A's row has expired too (it renews it every heartbeat
    // interval, an hour here, and it is alive for three), recovery presumes
    // A dead and frees the task.
    let t1 = t0 + chrono::Duration::hours(4);
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let report =
        outbox::maintenance::recover_stuck(&mut conn, Duration::from_secs(60), &Clock::fixed(t1))
            .await
            .unwrap();
    assert_eq!(report.recovered, vec![id]);

    // Worker B claims attempt 2 and is still running it when A wakes up.
    let (gate_b, mut started_b) = Gate::new();
    let mut b = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(quiet)
            .clock(Clock::fixed(t1))
            .handler::<Gated>(gate_b.clone())
            .build()
            .unwrap(),
    );
    assert_eq!(started_b.recv().await, Some(id.0));
    let row = || async {
        sqlx::query_as::<_, (String, i32, i32, Option<String>, Option<DateTime<Utc>>)>(
            "SELECT state::text, claims, retry_count, claimed_by, finished_at FROM outbox_all_tasks WHERE id = $1",
        )
        .bind(id.0)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    let during_b = row().await;
    assert_eq!(
        (during_b.0.as_str(), during_b.1, during_b.2),
        ("processing", 2, 1)
    );

    // A's late success is fenced out: B's attempt keeps the task.
    gate.permits.add_permits(1);
    a.wait_for(TaskEventKind::Stale, 1, WAIT).await;
    a.stop().await;
    assert_eq!(row().await, during_b, "the stale attempt changed nothing");

    // B's own outcome is written.
    gate_b.permits.add_permits(1);
    b.wait_for(TaskEventKind::Completed, 1, WAIT).await;
    b.stop().await;
    let (state, claims, retries, claimed_by, finished_at) = row().await;
    assert_eq!(
        (state.as_str(), claims, retries, claimed_by, finished_at),
        ("completed", 2, 1, None, Some(t1))
    );
}

#[tokio::test]
async fn a_claim_lost_in_a_server_crash_does_not_let_its_late_outcome_through() {
    let db = TestDb::migrated().await;
    let id = outbox::submit(&mut *db.conn().await, Gated {})
        .await
        .unwrap();
    let quiet = quiet();
    let row = || async {
        sqlx::query_as::<_, (String, i32, Option<String>)>(
            "SELECT state::text, claims, claimed_by FROM outbox_all_tasks WHERE id = $1",
        )
        .bind(id.0)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };

    // Worker A claims the task (claims 1) and runs it.
    let (gate, mut started) = Gate::new();
    let mut a = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(quiet.clone())
            .handler::<Gated>(gate.clone())
            .build()
            .unwrap(),
    );
    assert_eq!(started.recv().await, Some(id.0));
    let (_, claims, a_token) = row().await;
    assert_eq!(claims, 1);

    // The server crashes and loses A's asynchronously committed claim: the
    // row is as it was before it.
    sqlx::query(
        "UPDATE outbox_tasks SET state = 'pending', claims = claims - 1, \
         claimed_by = NULL, heartbeat_at = NULL WHERE id = $1",
    )
    .bind(id.0)
    .execute(&db.pool)
    .await
    .unwrap();

    // Worker B claims it again, with the same claims counter.
    let (gate_b, mut started_b) = Gate::new();
    let mut b = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(quiet)
            .handler::<Gated>(gate_b.clone())
            .build()
            .unwrap(),
    );
    assert_eq!(started_b.recv().await, Some(id.0));
    let during_b = row().await;
    assert_eq!((during_b.0.as_str(), during_b.1), ("processing", 1));
    assert_ne!(during_b.2, a_token, "every claim has a token of its own");

    // A's success arrives late: the counter matches, the token does not.
    gate.permits.add_permits(1);
    a.wait_for(TaskEventKind::Stale, 1, WAIT).await;
    a.stop().await;
    assert_eq!(
        row().await,
        during_b,
        "the lost claim's outcome changed nothing"
    );

    gate_b.permits.add_permits(1);
    b.wait_for(TaskEventKind::Completed, 1, WAIT).await;
    b.stop().await;
    assert_eq!(row().await, ("completed".to_owned(), 1, None));
}

#[tokio::test]
async fn heartbeats_move_for_every_in_flight_task_and_leave_updated_at_alone() {
    let db = TestDb::migrated().await;
    outbox::submit_batch(&mut *db.conn().await, (0..3).map(|_| Gated {}))
        .await
        .unwrap();
    let (gate, mut started) = Gate::new();
    let worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(WorkerConfig {
                heartbeat_interval: Duration::from_millis(50),
                maintenance: false,
                ..WorkerConfig::default()
            })
            .handler::<Gated>(gate.clone())
            .build()
            .unwrap(),
    );
    for _ in 0..3 {
        started.recv().await.unwrap();
    }
    sqlx::query(
        "CREATE TABLE first_seen AS SELECT id, heartbeat_at, updated_at FROM outbox_all_tasks",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    wait_until(
        &db.pool,
        "SELECT bool_and(t.heartbeat_at > f.heartbeat_at AND t.updated_at = f.updated_at) \
         FROM outbox_all_tasks t JOIN first_seen f USING (id)",
        WAIT,
    )
    .await;
    gate.permits.add_permits(3);
    worker.stop().await;
    assert_eq!(db.count_by_state().await, vec![("completed".to_owned(), 3)]);
}

#[tokio::test]
async fn cleanup_deletes_only_expired_completed_rows_in_batches() {
    let db = TestDb::migrated().await;
    sqlx::raw_sql(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, state, finished_at, dead_at, execute_at)
         SELECT 'x', 'cleanup', '{}', 1, 'completed', now() - interval '8 days', NULL, now() FROM generate_series(1, 25);
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, state, finished_at, execute_at)
         SELECT 'x', 'cleanup', '{}', 1, 'completed', now() - interval '1 day', now() FROM generate_series(1, 5);
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, retry_count, state, finished_at, dead_at)
         SELECT 'x', 'cleanup', '{}', 1, 1, 'failed', now() - interval '30 days', now() - interval '30 days'
         FROM generate_series(1, 4);
         INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) SELECT 'x', 'cleanup', '{}', 1
         FROM generate_series(1, 3);",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let week = Duration::from_secs(7 * 86_400);
    let report = outbox::maintenance::cleanup_completed(&mut conn, week, 10, &Clock::database())
        .await
        .unwrap();
    assert_eq!(
        (report.deleted, report.batches),
        (25, 4),
        "10 + 10 + 5 rows of outbox_tasks, one statement each, and one that \
         finds nothing expired in the history's default partition"
    );
    assert_eq!(
        db.count_by_state().await,
        vec![
            ("completed".to_owned(), 5),
            ("failed".to_owned(), 4),
            ("pending".to_owned(), 3)
        ]
    );

    // A week later the maintenance leader of a running worker removes the
    // rest of the completed history on its own; FAILED rows stay.
    let clock = Clock::fixed(Utc::now() + chrono::Duration::days(7));
    let worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(WorkerConfig {
                maintenance_interval: Duration::from_millis(50),
                ..WorkerConfig::default()
            })
            .clock(clock)
            .queue("cleanup-idle", 1)
            .build()
            .unwrap(),
    );
    wait_until(
        &db.pool,
        "SELECT count(*) = 0 FROM outbox_all_tasks WHERE state = 'completed'",
        WAIT,
    )
    .await;
    worker.stop().await;
    assert_eq!(
        db.count_by_state().await,
        vec![("failed".to_owned(), 4), ("pending".to_owned(), 3)]
    );
}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "test.crash.wake", queue = "wake")]
struct Wake {}

struct Nothing;

impl TaskHandler<Wake> for Nothing {
    async fn handle(&self, _ctx: TaskContext, _task: Wake) -> HandlerResult {
        Ok(Outcome::Success)
    }
}

const LISTENING: &str = "SELECT count(*) = 1 FROM pg_stat_activity \
                         WHERE datname = current_database() AND query ILIKE 'LISTEN%outbox_tasks%'";

#[tokio::test]
async fn notify_wakes_an_idle_worker_and_a_lost_listen_connection_comes_back() {
    let db = TestDb::migrated().await;
    // A fallback poll far longer than the test: only NOTIFY (or the
    // listener's reconnection) can explain a quick pickup.
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(WorkerConfig {
                poll_interval: Duration::from_secs(3600),
                maintenance: false,
                ..WorkerConfig::default()
            })
            .handler::<Wake>(Nothing)
            .build()
            .unwrap(),
    );
    wait_until(&db.pool, LISTENING, WAIT).await;
    // Far short of the hour-long poll, and long enough for a loaded
    // machine's fresh sessions.
    let quick = Duration::from_secs(60);
    let id = outbox::submit(&mut *db.conn().await, Wake {})
        .await
        .unwrap();
    let seen = worker.wait_for(TaskEventKind::Completed, 1, quick).await;
    assert_eq!(seen.last().unwrap().id, id);

    // Kill the LISTEN session; a task submitted while it is gone is still
    // found (the reconnected listener wakes every queue), and the new
    // session serves notifications again.
    let old_pid: i32 = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%outbox_tasks%'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(old_pid)
        .execute(&db.pool)
        .await
        .unwrap();
    outbox::submit(&mut *db.conn().await, Wake {})
        .await
        .unwrap();
    worker.wait_for(TaskEventKind::Completed, 1, WAIT).await;
    wait_until(&db.pool, LISTENING, WAIT).await;
    let new_pid: i32 = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%outbox_tasks%'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_ne!(new_pid, old_pid, "a new LISTEN session");
    outbox::submit(&mut *db.conn().await, Wake {})
        .await
        .unwrap();
    worker.wait_for(TaskEventKind::Completed, 1, quick).await;
    worker.stop().await;
}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "test.crash.elsewhere", queue = "crash-elsewhere")]
struct Elsewhere {}

struct Idle;

impl TaskHandler<Elsewhere> for Idle {
    async fn handle(&self, _ctx: TaskContext, _task: Elsewhere) -> HandlerResult {
        Ok(Outcome::Success)
    }
}

/// Recovery judges a task's heartbeat by the leader's timeout, which other
/// workers need not share: a worker that heartbeats every 10 s beside a
/// leader that gives up after 1 s is alive all the same, and its task must
/// not be taken from it and run twice (a new operator ran workers with
/// different settings and saw it). Its row, alive for three of its own
/// intervals, says it is.
#[tokio::test]
async fn a_leader_with_a_shorter_timeout_takes_no_task_from_a_live_slower_worker() {
    let db = TestDb::migrated().await;
    let id = outbox::submit(&mut *db.conn().await, Gated {})
        .await
        .unwrap();
    let (gate, mut started) = Gate::new();
    let mut slow = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(WorkerConfig {
                heartbeat_interval: Duration::from_secs(10),
                heartbeat_timeout: Duration::from_secs(60),
                maintenance: false,
                ..WorkerConfig::default()
            })
            .handler::<Gated>(gate.clone())
            .build()
            .unwrap(),
    );
    assert_eq!(started.recv().await, Some(id.0));
    let leader = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(WorkerConfig {
                heartbeat_interval: Duration::from_millis(300),
                heartbeat_timeout: Duration::from_secs(1),
                maintenance_interval: Duration::from_millis(300),
                ..WorkerConfig::default()
            })
            .handler::<Elsewhere>(Idle)
            .build()
            .unwrap(),
    );
    // The leader holds the maintenance lease, and the running task's
    // heartbeat is several of the leader's timeouts old (the slow worker
    // renews it every 10 s): recovery had its chances to take it (or took
    // it, and a second claim says so).
    wait_until(
        &db.pool,
        "SELECT EXISTS (SELECT 1 FROM outbox_leases WHERE name = 'maintenance' \
         AND expires_at > now())",
        WAIT,
    )
    .await;
    wait_until(
        &db.pool,
        &format!(
            "SELECT coalesce((SELECT claims > 1 OR heartbeat_at < now() - interval '5 seconds' \
             FROM outbox_all_tasks WHERE id = {id}), false)"
        ),
        WAIT,
    )
    .await;
    gate.permits.add_permits(1);
    slow.wait_for(TaskEventKind::Completed, 1, WAIT).await;
    slow.stop().await;
    leader.stop().await;
    let (claims, retries): (i32, i32) =
        sqlx::query_as("SELECT claims, retry_count FROM outbox_all_tasks WHERE id = $1")
            .bind(id.0)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (claims, retries),
        (1, 0),
        "the live worker's task was recovered"
    );
}
