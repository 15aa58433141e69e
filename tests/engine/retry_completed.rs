//! An operator's retry of a completed task runs it again (River's
//! `JobRetry`, Oban's `retry_job`): from the history, or kept in the task
//! table for its uniqueness; refused, with the reason, for a workflow's
//! step and for a unique task whose key a live task holds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, TaskId, TaskOptions, Unique,
    Worker, admin, outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.retry_completed.job", queue = "retry-completed")]
struct Job {}

/// Records the order tasks start in, and returns each one's run count.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<TaskId>>>);

impl TaskHandler<Job> for Runs {
    async fn handle(&self, ctx: TaskContext, _task: Job) -> HandlerResult {
        let mut runs = self.0.lock().unwrap();
        runs.push(ctx.id());
        Outcome::success_with(&runs.len())
    }
}

async fn submit(db: &TestDb, options: TaskOptions) -> TaskId {
    outbox::submit_with(&mut *db.conn().await, Job {}, options)
        .await
        .unwrap()
}

/// Runs `n` tasks to completion with a fresh worker.
async fn run(db: &TestDb, runs: &Runs, n: usize) {
    let mut running = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Job>(runs.clone())
            .build()
            .unwrap(),
    );
    running
        .wait_for(TaskEventKind::Completed, n, Duration::from_secs(60))
        .await;
    running.stop().await;
}

/// Where the task is (tasks or history), its state, result, claims and
/// retry count, over every row with its id.
async fn rows(db: &TestDb, id: TaskId) -> Vec<(String, String, Option<String>, i32)> {
    sqlx::query_as(
        "SELECT 'tasks', state::text, result::text, claims FROM outbox_tasks WHERE id = $1 \
         UNION ALL \
         SELECT 'history', 'completed', result::text, claims FROM outbox_task_history WHERE id = $1",
    )
    .bind(id.0)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_completed_task_retried_runs_again_under_its_id_and_is_recorded_once() {
    let db = TestDb::migrated().await;
    let id = submit(&db, TaskOptions::new()).await;
    let runs = Runs::default();
    run(&db, &runs, 1).await;
    assert_eq!(
        rows(&db, id).await,
        [("history".into(), "completed".into(), Some("1".into()), 1)]
    );

    assert_eq!(admin::retry_tasks(&db.pool, &[id]).await.unwrap(), [id]);
    // Back in the task table, due now, without its result.
    assert_eq!(
        rows(&db, id).await,
        [("tasks".into(), "pending".into(), None, 1)]
    );
    run(&db, &runs, 1).await;
    assert_eq!(*runs.0.lock().unwrap(), [id, id]);
    assert_eq!(
        rows(&db, id).await,
        [("history".into(), "completed".into(), Some("2".into()), 2)],
        "one record, of the second run"
    );
}

#[tokio::test]
async fn a_completed_keyed_task_queues_again_behind_the_waiting_ones() {
    let db = TestDb::migrated().await;
    let first = submit(&db, TaskOptions::new().ordering_key("k")).await;
    let runs = Runs::default();
    run(&db, &runs, 1).await;
    let waiting = submit(
        &db,
        TaskOptions::new()
            .ordering_key("k")
            .delay(Duration::from_secs(3600)),
    )
    .await;
    assert_eq!(
        admin::retry_tasks(&db.pool, &[first]).await.unwrap(),
        [first]
    );
    let (blocked, behind): (bool, bool) = sqlx::query_as(
        "SELECT r.blocked, r.key_seq > w.key_seq FROM outbox_tasks AS r, outbox_tasks AS w \
         WHERE r.id = $1 AND w.id = $2",
    )
    .bind(first.0)
    .bind(waiting.0)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        blocked && behind,
        "in line behind the task waiting for the key"
    );
    // The waiting one run now, both go, in line.
    assert_eq!(
        admin::retry_tasks(&db.pool, &[waiting]).await.unwrap(),
        [waiting]
    );
    run(&db, &runs, 2).await;
    assert_eq!(*runs.0.lock().unwrap(), [first, waiting, first]);
}

#[tokio::test]
async fn a_completed_unique_task_runs_again_unless_a_live_task_holds_its_key() {
    let db = TestDb::migrated().await;
    let live_only = || TaskOptions::new().unique(Unique::key("nightly"));
    let first = submit(&db, live_only()).await;
    let runs = Runs::default();
    run(&db, &runs, 1).await;
    let holder = submit(&db, live_only().delay(Duration::from_secs(3600))).await;
    assert_ne!(holder, first, "a completed task does not hold the key");
    assert_eq!(admin::retry_tasks(&db.pool, &[first]).await.unwrap(), []);
    assert_eq!(
        admin::why_not_retried(&db.pool, &[first]).await.unwrap(),
        [(first, format!("its unique key is held by task {holder}"))]
    );
    assert_eq!(rows(&db, first).await[0].0, "history", "left where it was");
    // The holder gone, it runs again and holds the key itself.
    admin::cancel_tasks(&db.pool, &[holder]).await.unwrap();
    assert_eq!(
        admin::retry_tasks(&db.pool, &[first]).await.unwrap(),
        [first]
    );
    let duplicate = outbox::submit_detailed(&mut *db.conn().await, Job {}, live_only())
        .await
        .unwrap();
    assert!(
        duplicate.duplicate && duplicate.id == first,
        "{duplicate:?}"
    );

    // Kept in the task table by a uniqueness that covers completed tasks:
    // run again in place, its result gone.
    let kept = submit(
        &db,
        TaskOptions::new().unique(Unique::key("kept").including_completed()),
    )
    .await;
    run(&db, &runs, 2).await;
    assert_eq!(
        rows(&db, kept).await,
        [("tasks".into(), "completed".into(), Some("3".into()), 1)]
    );
    assert_eq!(admin::retry_tasks(&db.pool, &[kept]).await.unwrap(), [kept]);
    assert_eq!(
        rows(&db, kept).await,
        [("tasks".into(), "pending".into(), None, 1)]
    );
}
