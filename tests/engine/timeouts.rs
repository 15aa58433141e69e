//! `#[outbox_task(timeout = ..)]`: at the timeout the handler's token fires
//! and the attempt fails with "timed out after ..."; a handler that ignores
//! its token is aborted after the cancel grace.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, Worker, WorkerConfig, admin,
    outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.timeout.slow", queue = "timeout-tests", timeout = "300ms", retry_delays = ["1h", "1h"])]
struct Slow {
    /// Whether the handler watches its token.
    polite: bool,
}

#[derive(Clone, Default)]
struct Sleeper {
    saw_token: Arc<AtomicBool>,
}

impl TaskHandler<Slow> for Sleeper {
    async fn handle(&self, ctx: TaskContext, task: Slow) -> HandlerResult {
        if task.polite {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(60)) => {}
                () = ctx.cancellation().cancelled() => self.saw_token.store(true, Ordering::SeqCst),
            }
            // Returning success after the timeout changes nothing.
            Ok(Outcome::Success)
        } else {
            // Ignores its token (a blocking call, say).
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(Outcome::Success)
        }
    }
}

async fn run_one(polite: bool) -> (admin::TaskRecord, bool) {
    let db = TestDb::migrated().await;
    let id = outbox::submit(&mut *db.conn().await, Slow { polite })
        .await
        .unwrap();
    let sleeper = Sleeper::default();
    let config = WorkerConfig {
        cancel_grace: Duration::from_millis(200),
        ..WorkerConfig::default()
    };
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(config)
            .handler::<Slow>(sleeper.clone())
            .build()
            .unwrap(),
    );
    worker
        .wait_for(TaskEventKind::Failed, 1, Duration::from_secs(20))
        .await;
    worker.stop().await;
    let row = admin::get_task(&db.pool, id).await.unwrap().unwrap();
    (row, sleeper.saw_token.load(Ordering::SeqCst))
}

#[tokio::test]
async fn a_handler_past_its_timeout_sees_its_token_fire_and_the_attempt_fails() {
    let (row, saw_token) = run_one(true).await;
    assert!(saw_token, "the token fired at the timeout");
    assert_eq!(row.state, "failed");
    assert_eq!(row.retry_count, 1, "an attempt counted");
    assert_eq!(row.last_error.as_deref(), Some("timed out after 300ms"));
    assert!(
        row.execute_at > chrono::Utc::now(),
        "the retry table applies"
    );
}

#[tokio::test]
async fn a_handler_that_ignores_its_token_is_aborted_and_fails_the_same_way() {
    let (row, _) = run_one(false).await;
    assert_eq!(row.state, "failed");
    assert_eq!(row.last_error.as_deref(), Some("timed out after 300ms"));
}
