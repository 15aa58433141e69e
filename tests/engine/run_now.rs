//! An operator's retry of a scheduled task: due now, with its budget, in
//! its key's line (River's `JobRetry`, Oban's `retry_job`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, TaskId, TaskOptions, Worker,
    admin, outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgListener;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.run_now.later", queue = "run-now")]
struct Later {}

/// Records the order tasks start in.
#[derive(Clone, Default)]
struct Started(Arc<Mutex<Vec<TaskId>>>);

impl TaskHandler<Later> for Started {
    async fn handle(&self, ctx: TaskContext, _task: Later) -> HandlerResult {
        self.0.lock().unwrap().push(ctx.id());
        Ok(Outcome::Success)
    }
}

async fn submit(db: &TestDb, options: TaskOptions) -> TaskId {
    let mut conn = db.conn().await;
    outbox::submit_with(&mut conn, Later {}, options)
        .await
        .unwrap()
}

fn in_an_hour() -> TaskOptions {
    TaskOptions::new()
        .delay(Duration::from_secs(3600))
        .max_attempts(4)
}

/// (state, due now, blocked, retry_count, max_attempts) of a task.
async fn row(db: &TestDb, id: TaskId) -> (String, bool, bool, i32, i32) {
    sqlx::query_as(
        "SELECT state::text, execute_at <= now(), blocked, retry_count, max_attempts \
         FROM outbox_all_tasks WHERE id = $1",
    )
    .bind(id.0)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

fn worker(db: &TestDb, started: &Started) -> RunningWorker {
    RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Later>(started.clone())
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn a_scheduled_task_retried_runs_now_with_its_budget_and_its_queue_is_woken() {
    let db = TestDb::migrated().await;
    let scheduled = submit(&db, in_an_hour()).await;
    let due = submit(&db, TaskOptions::new()).await;
    assert_eq!(
        row(&db, scheduled).await,
        ("pending".into(), false, false, 0, 4)
    );

    let mut listener = PgListener::connect_with(&db.pool).await.unwrap();
    listener.listen("outbox_tasks").await.unwrap();
    // The task due already is not retried: nothing to do for it.
    assert_eq!(
        admin::retry_tasks(&db.pool, &[scheduled, due, TaskId(999_999)])
            .await
            .unwrap(),
        vec![scheduled]
    );
    assert_eq!(
        row(&db, scheduled).await,
        ("pending".into(), true, false, 0, 4)
    );
    let notice = tokio::time::timeout(Duration::from_secs(30), listener.recv())
        .await
        .expect("the queue is notified")
        .unwrap();
    assert_eq!(notice.payload(), "run-now");
    // Due now: a second retry has nothing to do.
    assert_eq!(
        admin::retry_tasks(&db.pool, &[scheduled]).await.unwrap(),
        vec![]
    );

    let started = Started::default();
    let mut running = worker(&db, &started);
    running
        .wait_for(TaskEventKind::Completed, 2, Duration::from_secs(60))
        .await;
    running.stop().await;
    let mut ran = started.0.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(ran, vec![scheduled, due], "each ran once");
}

#[tokio::test]
async fn a_scheduled_task_behind_its_key_still_waits_for_its_turn() {
    let db = TestDb::migrated().await;
    let head = submit(&db, in_an_hour().ordering_key("k")).await;
    let behind = submit(&db, in_an_hour().ordering_key("k")).await;
    assert_eq!(
        row(&db, behind).await,
        ("pending".into(), false, true, 0, 4)
    );

    assert_eq!(
        admin::retry_tasks(&db.pool, &[behind]).await.unwrap(),
        vec![behind]
    );
    // Due now, and still in line behind the head, which holds the key.
    assert_eq!(row(&db, behind).await, ("pending".into(), true, true, 0, 4));
    assert_eq!(row(&db, head).await, ("pending".into(), false, false, 0, 4));

    assert_eq!(
        admin::retry_tasks(&db.pool, &[head]).await.unwrap(),
        vec![head]
    );
    let started = Started::default();
    let mut running = worker(&db, &started);
    running
        .wait_for(TaskEventKind::Completed, 2, Duration::from_secs(60))
        .await;
    running.stop().await;
    assert_eq!(*started.0.lock().unwrap(), vec![head, behind], "in line");
}
