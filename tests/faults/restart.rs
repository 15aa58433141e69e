//! PostgreSQL restarted in the middle of a drain.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, Worker, WorkerConfig,
    outbox_task,
};
use outbox_tests::RunningWorker;
use outbox_worker::local_postgres::{LocalPostgres, LocalPostgresOptions};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_mid_drain_loses_nothing_and_the_worker_carries_on() {
    // A cluster of this test's own: restarting the shared one would hit
    // every other test.
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| LocalPostgres::start(&LocalPostgresOptions::default()))
            .await
            .unwrap()
            .expect("start a private PostgreSQL"),
    );
    let url = cluster.url("postgres");
    let pool = outbox_tests::TestDb::pool_on(&url, 10).await;
    outbox::migrate(&pool).await.unwrap();
    outbox::submit_batch(
        &mut pool.acquire().await.unwrap(),
        (0..TASKS).map(|_| Count {}),
    )
    .await
    .unwrap();

    let counter = Counter::default();
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(50),
        heartbeat_interval: Duration::from_millis(200),
        heartbeat_timeout: Duration::from_secs(2),
        maintenance_interval: Duration::from_millis(200),
        ..WorkerConfig::default()
    };
    let mut worker = RunningWorker::start(
        Worker::builder(pool.clone())
            .config(config)
            .handler::<Count>(counter.clone())
            .queue("restart", 16)
            .build()
            .unwrap(),
    );

    let mut completed = HashSet::new();
    let mut restarted = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while completed.len() < TASKS {
        let event = match tokio::time::timeout_at(deadline, worker.events.recv()).await {
            Ok(Ok(e)) => e,
            Ok(Err(RecvError::Lagged(n))) => panic!("lagged by {n}"),
            Ok(Err(RecvError::Closed)) => panic!("the worker exited"),
            Err(_) => panic!("timed out with {} of {TASKS} completed", completed.len()),
        };
        if event.kind == TaskEventKind::Completed {
            completed.insert(event.id);
        }
        if !restarted && completed.len() >= 1000 {
            restarted = true;
            let c = Arc::clone(&cluster);
            tokio::task::spawn_blocking(move || c.restart())
                .await
                .unwrap()
                .expect("pg_ctl restart");
            eprintln!(
                "restart: PostgreSQL restarted after {} completions",
                completed.len()
            );
        }
    }
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state::text, count(*) FROM outbox_tasks GROUP BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    worker.stop().await;
    let executions = counter.0.load(Ordering::Relaxed);
    eprintln!(
        "restart: {TASKS} of {TASKS} COMPLETED after the restart; {executions} executions ({} repeated)",
        executions - TASKS
    );
    assert_eq!(states, vec![("completed".to_owned(), TASKS as i64)]);
    assert!(executions >= TASKS);
}
