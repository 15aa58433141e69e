//! PostgreSQL restarted, and stopped for a while, in the middle of a drain;
//! and a worker told to stop while its database is down.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    Batch, HandlerResult, Outcome, TaskContext, TaskHandler, Worker, WorkerConfig, outbox_task,
};
use outbox_tests::RunningWorker;
use outbox_tests::process::{WorkerProcess, wait_until};
use outbox_tests::tasks::{Record, create_executions_table};
use outbox_worker::local_postgres::{LocalPostgres, LocalPostgresOptions};
use serde::{Deserialize, Serialize};

use crate::WORKER;

const TASKS: usize = 5000;

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "test.restart.count", queue = "restart")]
struct Count {}

#[derive(Clone, Default)]
struct Counter(Arc<AtomicUsize>);

impl TaskHandler<Count> for Counter {
    async fn handle(&self, _ctx: TaskContext, _task: Count) -> HandlerResult {
        self.0.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(Outcome::Success)
    }
}

/// A cluster of the test's own (restarting or stopping the shared one
/// would hit every other test) and its URL.
pub(crate) async fn private_cluster() -> (Arc<LocalPostgres>, String) {
    let cluster =
        tokio::task::spawn_blocking(|| LocalPostgres::start(&LocalPostgresOptions::default()))
            .await
            .unwrap()
            .expect("start a private PostgreSQL");
    let url = cluster.url("postgres");
    (Arc::new(cluster), url)
}

/// A private cluster, migrated, with `n` tasks of `Count` submitted; a pool
/// of `sessions` on it.
async fn cluster_with_counts(
    n: usize,
    sessions: u32,
) -> (Arc<LocalPostgres>, String, sqlx::PgPool) {
    let (cluster, url) = private_cluster().await;
    let pool = outbox_tests::TestDb::pool_on(&url, sessions).await;
    outbox::migrate(&pool).await.unwrap();
    outbox::submit_batch(&mut pool.acquire().await.unwrap(), (0..n).map(|_| Count {}))
        .await
        .unwrap();
    (cluster, url, pool)
}

/// A worker that polls, heartbeats and recovers quickly, for drains
/// through a restart and an outage.
pub(crate) fn outage_config() -> WorkerConfig {
    WorkerConfig {
        poll_interval: Duration::from_millis(50),
        heartbeat_interval: Duration::from_millis(200),
        heartbeat_timeout: Duration::from_secs(2),
        maintenance_interval: Duration::from_millis(200),
        ..WorkerConfig::default()
    }
}

/// Stops `cluster`'s server for `down`, then starts it again.
pub(crate) async fn down_for(cluster: &Arc<LocalPostgres>, down: Duration) {
    on(cluster, LocalPostgres::stop_server).await;
    tokio::time::sleep(down).await;
    on(cluster, LocalPostgres::start_again).await;
}

/// Runs a pg_ctl step on `cluster` off the async threads.
pub(crate) async fn on(
    cluster: &Arc<LocalPostgres>,
    step: fn(&LocalPostgres) -> Result<(), outbox_worker::local_postgres::LocalPostgresError>,
) {
    let c = Arc::clone(cluster);
    tokio::task::spawn_blocking(move || step(&c))
        .await
        .unwrap()
        .expect("pg_ctl");
}

/// Waits until `total` tasks have completed, restarting PostgreSQL once
/// `restart_at` have and stopping it for three seconds once `down_at` have
/// (handlers finish meanwhile; their outcomes wait in the worker until the
/// server is back). `handled` counts the handlers that finished, for the
/// log. Waits on the table, not on events: an outcome whose commit was
/// acknowledged to nobody (the session died right after COMMIT) is
/// reported as stale by the worker, though the row is right.
async fn complete_through_a_restart_and_an_outage(
    cluster: &Arc<LocalPostgres>,
    pool: &sqlx::PgPool,
    total: i64,
    restart_at: i64,
    down_at: i64,
    handled: impl Fn() -> usize,
) {
    let completed = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM outbox_all_tasks WHERE state = 'completed'",
        )
        .fetch_one(pool)
        .await
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let (mut restarted, mut was_down) = (false, false);
    loop {
        let done = completed().await.unwrap_or(0);
        if done == total {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out with {done} of {total} completed"
        );
        if !restarted && done >= restart_at {
            restarted = true;
            on(cluster, LocalPostgres::restart).await;
            eprintln!("restart: PostgreSQL restarted after {done} completions");
        } else if restarted && !was_down && done >= down_at {
            was_down = true;
            let before = handled();
            down_for(cluster, Duration::from_secs(3)).await;
            eprintln!(
                "restart: PostgreSQL down for 3 s after {done} completions; {} handlers finished while it was down",
                handled() - before
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(restarted && was_down, "both faults happened mid-drain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_and_an_outage_mid_drain_lose_nothing_and_rerun_nothing() {
    let (cluster, _, pool) = cluster_with_counts(TASKS, 10).await;

    let counter = Counter::default();
    let config = outage_config();
    let worker = RunningWorker::start(
        Worker::builder(pool.clone())
            .config(config)
            .handler::<Count>(counter.clone())
            .queue("restart", 16)
            .build()
            .unwrap(),
    );

    complete_through_a_restart_and_an_outage(&cluster, &pool, TASKS as i64, 1000, 2500, || {
        counter.0.load(Ordering::Relaxed)
    })
    .await;
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state::text, count(*) FROM outbox_all_tasks GROUP BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    worker.stop().await;
    let executions = counter.0.load(Ordering::Relaxed);
    eprintln!(
        "restart: {TASKS} of {TASKS} COMPLETED after a restart and an outage; {executions} executions ({} repeated)",
        executions - TASKS
    );
    assert_eq!(states, vec![("completed".to_owned(), TASKS as i64)]);
    assert_eq!(
        executions, TASKS,
        "no task ran twice because of the outages"
    );
}

#[derive(Serialize, Deserialize)]
#[outbox_task(
    task_type = "test.restart.keyed",
    queue = "restart_keyed",
    ordering_key = "key"
)]
struct KeyedStep {
    key: String,
    n: i64,
}

/// What ran, kept in memory (not in the database, which goes away): each
/// key's steps in the order they started, and every start that found its
/// key already running.
#[derive(Clone, Default)]
struct KeyedLog {
    started: Arc<Mutex<HashMap<String, Vec<i64>>>>,
    running: Arc<Mutex<HashMap<String, usize>>>,
    overlaps: Arc<Mutex<Vec<(String, i64)>>>,
}

/// A key counted as running until dropped, however the handler ends.
struct Running<'a>(&'a KeyedLog, String);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(now) = self.0.running.lock().unwrap().get_mut(&self.1) {
            *now -= 1;
        }
    }
}

impl TaskHandler<KeyedStep> for KeyedLog {
    async fn handle(&self, _ctx: TaskContext, task: KeyedStep) -> HandlerResult {
        {
            let mut running = self.running.lock().unwrap();
            let now = running.entry(task.key.clone()).or_insert(0);
            *now += 1;
            if *now > 1 {
                self.overlaps
                    .lock()
                    .unwrap()
                    .push((task.key.clone(), task.n));
            }
        }
        let _running = Running(self, task.key.clone());
        self.started
            .lock()
            .unwrap()
            .entry(task.key.clone())
            .or_default()
            .push(task.n);
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(Outcome::Success)
    }
}

/// Keyed tasks are handed on from one to the next at each outcome (the
/// outcome's transaction unblocks the key's next task). Through a restart
/// and an outage, no key may stall, run two at once, skip a step or run
/// one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_and_an_outage_mid_keyed_drain_keep_each_keys_order_and_lose_nothing() {
    const KEYS: i64 = 40;
    const STEPS: i64 = 50;
    let total = KEYS * STEPS;
    let (cluster, url) = private_cluster().await;
    let pool = outbox_tests::TestDb::pool_on(&url, 10).await;
    outbox::migrate(&pool).await.unwrap();
    let mut batch = Batch::new();
    for n in 1..=STEPS {
        for k in 0..KEYS {
            batch
                .push(&KeyedStep {
                    key: format!("k{k}"),
                    n,
                })
                .unwrap();
        }
    }
    batch
        .submit(&mut pool.acquire().await.unwrap())
        .await
        .unwrap();

    let log = KeyedLog::default();
    let worker = RunningWorker::start(
        Worker::builder(pool.clone())
            .config(outage_config())
            .handler::<KeyedStep>(log.clone())
            .queue("restart_keyed", 16)
            .build()
            .unwrap(),
    );
    let started = || log.started.lock().unwrap().values().map(Vec::len).sum();
    complete_through_a_restart_and_an_outage(&cluster, &pool, total, total / 4, total / 2, started)
        .await;
    worker.stop().await;
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state::text, count(*) FROM outbox_all_tasks GROUP BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(states, vec![("completed".to_owned(), total)]);
    let overlaps = log.overlaps.lock().unwrap().clone();
    assert!(
        overlaps.is_empty(),
        "steps started while their key was running: {overlaps:?}"
    );
    let started = log.started.lock().unwrap().clone();
    let runs: usize = started.values().map(Vec::len).sum();
    eprintln!("restart: {total} keyed tasks over {KEYS} keys completed; {runs} executions");
    let want: Vec<i64> = (1..=STEPS).collect();
    for k in 0..KEYS {
        let key = format!("k{k}");
        assert_eq!(
            started.get(&key),
            Some(&want),
            "{key}'s steps ran once each, in order"
        );
    }
}

#[tokio::test]
async fn sigterm_with_the_database_down_exits_within_the_bound_and_names_what_it_left() {
    let (cluster, url) = private_cluster().await;
    let pool = outbox_tests::TestDb::pool_on(&url, 4).await;
    outbox::migrate(&pool).await.unwrap();
    create_executions_table(&pool).await;
    let mut batch = Batch::new();
    for _ in 0..4 {
        batch.push(&Record { ms: 600_000 }).unwrap();
    }
    let ids = batch
        .submit(&mut pool.acquire().await.unwrap())
        .await
        .unwrap();
    let mut worker = WorkerProcess::spawn(
        WORKER,
        &url,
        &[
            "--queue",
            "record=8",
            "--shutdown-grace",
            "1s",
            "--flush-timeout",
            "2s",
            "--statement-timeout",
            "1s",
        ],
    );
    wait_until(
        &pool,
        "SELECT count(*) = 4 FROM executions",
        Duration::from_secs(30),
    )
    .await;
    on(&cluster, LocalPostgres::stop_server).await;

    // grace 1 s + 2 x cancel grace 1 s + flush 2 s, and up to a second for
    // the runtime to wind down.
    let bound = Duration::from_secs(6);
    let took = worker
        .terminate_within(bound + Duration::from_secs(5))
        .await;
    eprintln!("database down: SIGTERM to exit took {took:?} (bound {bound:?})");
    worker.assert_left_behind(&ids);

    // The tasks stayed PROCESSING: recovery returns them after the timeout.
    on(&cluster, LocalPostgres::start_again).await;
    let pool = outbox_tests::TestDb::pool_on(&url, 2).await;
    let processing: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks WHERE state = 'processing'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(processing, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcome_counts_kept_through_an_outage_reach_the_throughput_table() {
    const N: i64 = 300;
    let (cluster, url, pool) = cluster_with_counts(N as usize, 4).await;
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(50),
        statement_timeout: Duration::from_secs(1),
        ..WorkerConfig::default()
    };
    let worker = RunningWorker::start(
        Worker::builder(pool.clone())
            .config(config)
            .handler::<Count>(Counter::default())
            .queue("restart", 16)
            .build()
            .unwrap(),
    );
    wait_until(
        &pool,
        &format!("SELECT count(*) = {N} FROM outbox_all_tasks WHERE state = 'completed'"),
        Duration::from_secs(60),
    )
    .await;
    // The counts are written every few seconds: most likely they are still
    // in the worker now. The writes during the outage fail; the counts must
    // be kept for the write after it.
    down_for(&cluster, Duration::from_secs(6)).await;
    let pool = outbox_tests::TestDb::pool_on(&url, 2).await;
    wait_until(
        &pool,
        &format!(
            "SELECT coalesce(sum(completed), 0) = {N} FROM outbox_throughput WHERE queue = 'restart'"
        ),
        Duration::from_secs(30),
    )
    .await;
    worker.stop().await;
    let failed: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(failed), 0)::bigint FROM outbox_throughput WHERE queue = 'restart'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(failed, 0);
}

/// The worker's own row and a limited queue's claims (a transaction under
/// the queue's lock) through a database outage: the limit holds, nothing
/// is lost, and the row is renewed once the database is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_queue_and_the_worker_row_come_through_an_outage() {
    const N: i64 = 40;
    let (cluster, url) = private_cluster().await;
    let pool = outbox_tests::TestDb::pool_on(&url, 4).await;
    outbox::migrate(&pool).await.unwrap();
    outbox_tests::tasks::create_intervals_table(&pool).await;
    let limit = outbox::admin::QueueChange::new().global_concurrency(2);
    outbox::admin::set_queue(&pool, "limited", &limit)
        .await
        .unwrap();
    outbox::submit_batch(
        &mut pool.acquire().await.unwrap(),
        (0..N).map(|_| outbox_tests::tasks::Slot { ms: 50 }),
    )
    .await
    .unwrap();
    let mut worker = WorkerProcess::spawn(
        WORKER,
        &url,
        &[
            "--queue",
            "limited=4",
            "--poll-interval",
            "100ms",
            "--heartbeat-interval",
            "200ms",
            "--statement-timeout",
            "1s",
        ],
    );
    wait_until(
        &pool,
        "SELECT count(*) >= 10 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(60),
    )
    .await;
    on(&cluster, LocalPostgres::stop_server).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    on(&cluster, LocalPostgres::start_again).await;
    let pool = outbox_tests::TestDb::pool_on(&url, 2).await;
    let back: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .unwrap();
    wait_until(
        &pool,
        &format!("SELECT count(*) = {N} FROM outbox_all_tasks WHERE state = 'completed'"),
        Duration::from_secs(60),
    )
    .await;
    wait_until(
        &pool,
        &format!(
            "SELECT count(*) = 1 FROM outbox_workers WHERE last_seen_at > '{}'::timestamptz",
            back.to_rfc3339()
        ),
        Duration::from_secs(30),
    )
    .await;
    worker.terminate_within(Duration::from_secs(10)).await;
    let overlap = outbox_tests::tasks::max_overlap_of_finished(&pool).await;
    assert!(overlap <= 2, "{overlap} ran at once under a limit of 2");
}

/// A worker that starts while PostgreSQL is down can neither check its
/// schema nor claim: it keeps trying, and once the server is back it reads
/// where its queue's last slow walk began (migration 35) and every task
/// runs, once, the ones before the recorded walk's front included.
#[tokio::test]
async fn a_worker_started_while_the_database_is_down_runs_every_task_once_when_it_is_back() {
    const N: usize = 40;
    let (cluster, url, pool) = cluster_with_counts(N, 4).await;
    // A slow walk that found the 21st task first, ended just now: half the
    // tasks lie before it.
    sqlx::query(
        "INSERT INTO outbox_claim_fronts (queue, priority, execute_at, id, walk_ms, walked_at) \
         SELECT queue, priority, execute_at, id, 1000, now() FROM outbox_tasks \
         ORDER BY id OFFSET 20 LIMIT 1",
    )
    .execute(&pool)
    .await
    .unwrap();
    on(&cluster, LocalPostgres::stop_server).await;
    let counter = Counter::default();
    let worker = RunningWorker::start(
        Worker::builder(pool.clone())
            .config(outage_config())
            .handler::<Count>(counter.clone())
            .queue("restart", 4)
            .build()
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    on(&cluster, LocalPostgres::start_again).await;
    let pool = outbox_tests::TestDb::pool_on(&url, 2).await;
    wait_until(
        &pool,
        &format!("SELECT count(*) = {N} FROM outbox_all_tasks WHERE state = 'completed'"),
        Duration::from_secs(60),
    )
    .await;
    worker.stop().await;
    assert_eq!(counter.0.load(Ordering::Relaxed), N, "each task ran once");
}
