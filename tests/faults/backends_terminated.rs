//! The worker's sessions terminated again and again (as `pg_terminate_backend`
//! or a failover does) while tasks run their last attempts: every error is
//! transient, so no outcome is dropped, no task ends dead although its
//! handler succeeded, and no attempt runs twice; and while hot ordering
//! keys are handed on from each outcome to the next task, which still runs
//! each step once, in its key's order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    HandlerError, HandlerResult, Outcome, TaskContext, TaskHandler, Worker, WorkerConfig,
    outbox_task,
};
use outbox_tests::process::wait_until;
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

const TASKS: usize = 1000;

/// Fails its first two attempts and succeeds on the third, the last.
#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "test.terminate.third_time", queue = "terminate", retry_delays = ["1ms", "1ms", "1ms"])]
struct ThirdTime {}

/// Counts executions per (task, attempt).
#[derive(Clone, Default)]
struct Attempts(Arc<Mutex<HashMap<(i64, i32), u32>>>);

impl TaskHandler<ThirdTime> for Attempts {
    async fn handle(&self, ctx: TaskContext, _task: ThirdTime) -> HandlerResult {
        *self
            .0
            .lock()
            .unwrap()
            .entry((ctx.id().0, ctx.attempt()))
            .or_default() += 1;
        if ctx.is_last_attempt() {
            Ok(Outcome::Success)
        } else {
            Err(HandlerError::msg("not yet"))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_sessions_lose_no_outcome_and_rerun_nothing() {
    let db = TestDb::migrated().await;
    outbox::submit_batch(&mut *db.conn().await, (0..TASKS).map(|_| ThirdTime {}))
        .await
        .unwrap();
    let attempts = Attempts::default();
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(50),
        heartbeat_interval: Duration::from_millis(200),
        // Far away: a recovery would be a re-run this test must not see.
        heartbeat_timeout: Duration::from_secs(120),
        maintenance_interval: Duration::from_millis(100),
        max_finish_batch: 50,
        // The leader's vacuum and its history partition statements run
        // through the terminations too.
        vacuum_threshold: 500,
        cleanup_interval: Duration::from_millis(100),
        ..WorkerConfig::default()
    };
    let worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(config)
            .handler::<ThirdTime>(attempts.clone())
            .queue("terminate", 32)
            .build()
            .unwrap(),
    );

    // Terminate every engine session of this database every 30 ms (slower
    // while nothing finishes) until the last task is done.
    let (terminated, rounds, longest) = terminate_until(
        &db,
        "SELECT count(*) FROM outbox_all_tasks WHERE state = 'completed' OR dead_at IS NOT NULL",
        TASKS as i64,
    )
    .await;
    // The vacuumer came through: its sessions were terminated with the
    // rest, and it still vacuums the dead versions the drain left.
    wait_until(
        &db.pool,
        "SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'outbox_tasks'",
        Duration::from_secs(30),
    )
    .await;
    worker.stop().await;

    let states = db.count_by_state().await;
    let dead: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks WHERE dead_at IS NOT NULL")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let attempts = attempts.0.lock().unwrap().clone();
    let executions: u32 = attempts.values().sum();
    let repeated: Vec<_> = attempts.iter().filter(|(_, n)| **n > 1).collect();
    eprintln!(
        "terminate: {terminated} sessions terminated over {rounds} rounds (at most {longest:?} \
         apart); {TASKS} tasks, \
         {executions} executions (3 each expected), {} attempts run twice, {dead} dead",
        repeated.len()
    );
    assert!(terminated > 0, "the test terminated sessions");
    assert_eq!(dead, 0, "no task dead whose last attempt succeeded");
    assert_eq!(states, vec![("completed".to_owned(), TASKS as i64)]);
    assert!(repeated.is_empty(), "attempts run twice: {repeated:?}");
    assert_eq!(
        executions as usize,
        3 * TASKS,
        "every task ran exactly 3 attempts"
    );
}

/// The hot-key test: its keys, and the steps of each (run one at a time).
const KEYS: i64 = 3;
const STEPS: i64 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_sessions_break_no_hand_on_of_a_hot_key() {
    hot_keys_through_terminations(1).await;
}

/// The same with runs (`key_run`): a claim takes a key's next steps
/// together and each outcome but the last keeps the key. An outcome whose
/// answer is lost (its session terminated after the commit) is fenced out
/// when retried, and the rest of its run goes back and on in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_sessions_break_no_run_of_a_hot_key() {
    hot_keys_through_terminations(8).await;
}

/// Drains hot keys while every engine session is terminated again and
/// again; `key_run` 1 hands each key on step by step, more claims runs.
async fn hot_keys_through_terminations(key_run: usize) {
    use outbox_tests::tasks::{
        IntervalRecorder, Step, assert_one_at_a_time, create_intervals_table,
    };
    let db = TestDb::migrated().await;
    create_intervals_table(&db.pool).await;
    let mut batch = outbox::Batch::new();
    for n in 1..=STEPS {
        for k in 0..KEYS {
            batch.push(&Step::new(&format!("k{k}"), n, 0)).unwrap();
        }
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    let worker = Worker::builder(db.pool.clone())
        .config(WorkerConfig {
            poll_interval: Duration::from_millis(50),
            // Never within the test: a hand-on whose answer was lost must be
            // released by its claim token, not left to stuck-task recovery
            // (which would leave the key stalled here until the deadline).
            heartbeat_timeout: Duration::from_secs(3600),
            key_run,
            ..WorkerConfig::default()
        })
        .handler::<Step>(IntervalRecorder)
        .queue("ordered", 8)
        .build()
        .unwrap();
    let counters = worker.counters();
    let running = RunningWorker::start(worker);
    let total = KEYS * STEPS;
    let (terminated, rounds, longest) = terminate_until(
        &db,
        "SELECT count(*) FROM outbox_all_tasks WHERE state = 'completed'",
        total,
    )
    .await;
    running.stop().await;

    // Each step ran once, after the one before it of its key had finished.
    let twice: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, n FROM intervals GROUP BY task_id, key, n HAVING count(*) > 1")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let by_key = assert_one_at_a_time(&db.pool).await;
    let c = counters.snapshot();
    eprintln!(
        "terminate, hot keys, key runs of {key_run}: {terminated} sessions terminated over \
         {rounds} rounds (at most {longest:?} apart); {total} steps on {KEYS} keys, {} handed on, {} run on in runs, {} run twice",
        c.tasks_handed_on,
        c.tasks_run_on,
        twice.len()
    );
    assert!(terminated > 0, "the test terminated sessions");
    assert!(twice.is_empty(), "steps run twice: {twice:?}");
    if key_run == 1 {
        assert!(
            c.tasks_handed_on > 0,
            "the hand-on ran through the terminations"
        );
    } else {
        assert!(c.tasks_run_on > 0, "runs went on through the terminations");
    }
    let expected: Vec<(String, Vec<i64>)> = (0..KEYS)
        .map(|k| (format!("k{k}"), (1..=STEPS).collect()))
        .collect();
    assert_eq!(by_key, expected, "each key's steps in order");
}

/// Terminates every engine session of the test's database every 30 ms
/// until `count` (a bigint query: tasks finished) reaches `target`; returns
/// the sessions terminated, the rounds and the longest pause between
/// rounds.
///
/// Each termination costs the worker a fresh backend, whose first
/// statement must load its catalog caches and plan; on a loaded machine
/// that can take longer than 30 ms, and then no statement ever completes
/// (at a 3 ms pause no task finished in 40 s even on an idle machine).
/// So while the count stands still the pause doubles every 3 s, up to
/// 1 s, and each time the count moves it halves, down to 30 ms: the
/// sessions are terminated over and over at about the fastest pace the
/// machine lets the worker get through. A lost outcome or a key that never
/// goes on stops the count at any pace: the test fails when it stands still
/// for two minutes.
async fn terminate_until(db: &TestDb, count: &str, target: i64) -> (i64, usize, Duration) {
    const STALL: Duration = Duration::from_secs(120);
    const FASTEST: Duration = Duration::from_millis(30);
    const SLOWEST: Duration = Duration::from_secs(1);
    const PATIENCE: Duration = Duration::from_secs(3);
    let mut terminated = 0_i64;
    let mut rounds = 0;
    let (mut pause, mut longest) = (FASTEST, FASTEST);
    let (mut last, mut moved_at) = (-1_i64, tokio::time::Instant::now());
    let mut slowed_at = moved_at;
    loop {
        let (done, killed): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT ({count}), \
                    (SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                      WHERE datname = current_database() AND application_name LIKE $1 \
                        AND pid <> pg_backend_pid()) t)"
        )))
        .bind(format!("{} %", outbox::ENGINE_APPLICATION_NAME))
        .fetch_one(&db.pool)
        .await
        .unwrap();
        terminated += killed;
        rounds += 1;
        if done >= target {
            return (terminated, rounds, longest);
        }
        let now = tokio::time::Instant::now();
        if done != last {
            (last, moved_at, slowed_at) = (done, now, now);
            pause = (pause / 2).max(FASTEST);
        } else if now - slowed_at >= PATIENCE && pause < SLOWEST {
            (slowed_at, pause) = (now, (pause * 2).min(SLOWEST));
            longest = longest.max(pause);
        }
        assert!(
            moved_at.elapsed() < STALL,
            "stuck at {done} of {target} for {STALL:?} after {rounds} rounds, \
             the last {pause:?} apart: {count}"
        );
        tokio::time::sleep(pause).await;
    }
}
