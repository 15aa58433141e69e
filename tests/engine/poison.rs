//! Poison rows (a payload that does not decode, a task type nobody handles,
//! an outcome the database refuses) fail with a clear message and never
//! block the tasks behind them.

use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, TaskOptions, Worker,
    outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.poison.strict", queue = "poison-tests")]
struct Strict {
    amount_cents: u64,
}

struct Accept;

impl TaskHandler<Strict> for Accept {
    async fn handle(&self, _ctx: TaskContext, _task: Strict) -> HandlerResult {
        Ok(Outcome::Success)
    }
}

#[tokio::test]
async fn poison_rows_fail_clearly_and_do_not_block_the_queue() {
    let db = TestDb::migrated().await;
    // First in line: a payload of the right type name but the wrong shape
    // (as an old or foreign producer might write), then a task type this
    // worker does not know, then ten good tasks.
    let registered = outbox::find_registered("test.poison.strict").unwrap();
    let mut batch = outbox::Batch::new();
    batch
        .push_json(
            registered,
            &serde_json::json!({"amount_cents": "twelve"}),
            TaskOptions::new(),
        )
        .unwrap();
    batch.submit(&mut *db.conn().await).await.unwrap();
    sqlx::query(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) \
         VALUES ('test.poison.nobody', 'poison-tests', '{}', 10)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    outbox::submit_batch(
        &mut *db.conn().await,
        (0..10).map(|i| Strict { amount_cents: i }),
    )
    .await
    .unwrap();

    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Strict>(Accept)
            .queue("poison-tests", 1)
            .build()
            .unwrap(),
    );
    let events = worker
        .wait_for_all(
            &[
                (TaskEventKind::Completed, 10),
                (TaskEventKind::Dead, 1),
                (TaskEventKind::Failed, 1),
            ],
            Duration::from_secs(20),
        )
        .await;
    worker.stop().await;
    let failed = events
        .iter()
        .filter(|e| matches!(e.kind, TaskEventKind::Failed | TaskEventKind::Dead))
        .count();
    assert_eq!(failed, 2, "{events:?}");

    // The undecodable payload can never succeed: dead at once, with the
    // decode error. The unknown type is retried (a newer worker may know it).
    let rows: Vec<(String, String, i32, String)> = sqlx::query_as(
        "SELECT task_type, CASE WHEN dead_at IS NULL THEN state::text ELSE 'dead' END, \
                retry_count, last_error FROM outbox_all_tasks \
         WHERE last_error IS NOT NULL ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (ty, state, retries, error) = &rows[0];
    assert_eq!(
        (ty.as_str(), state.as_str(), *retries),
        ("test.poison.strict", "dead", 1)
    );
    assert!(
        error.contains("payload does not decode into")
            && error.contains("Strict")
            && error.contains("expected u64")
            && error.contains("dead at once"),
        "{error}"
    );
    let (ty, state, retries, error) = &rows[1];
    assert_eq!(
        (ty.as_str(), state.as_str(), *retries),
        ("test.poison.nobody", "failed", 1)
    );
    assert!(
        error.contains("no handler for task type \"test.poison.nobody\"")
            && error.contains("test.poison.strict"),
        "{error}"
    );
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.poison.binary_error", queue = "poison-binary")]
struct BinaryError {
    fail: bool,
}

struct Garbled;

impl TaskHandler<BinaryError> for Garbled {
    async fn handle(&self, _ctx: TaskContext, task: BinaryError) -> HandlerResult {
        if task.fail {
            // PostgreSQL text cannot hold NUL: written as is, this outcome
            // would be rejected and could hold back the batch around it.
            Err(outbox::HandlerError::msg("bytes \0\u{1} from a device"))
        } else {
            Ok(Outcome::Success)
        }
    }
}

#[tokio::test]
async fn an_unstorable_error_message_is_cleaned_and_blocks_nothing() {
    let db = TestDb::migrated().await;
    let mut batch = outbox::Batch::new();
    batch.push(&BinaryError { fail: true }).unwrap();
    for _ in 0..5 {
        batch.push(&BinaryError { fail: false }).unwrap();
    }
    let ids = batch.submit(&mut *db.conn().await).await.unwrap();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<BinaryError>(Garbled)
            .build()
            .unwrap(),
    );
    worker
        .wait_for_all(
            &[(TaskEventKind::Completed, 5), (TaskEventKind::Failed, 1)],
            Duration::from_secs(20),
        )
        .await;
    worker.stop().await;
    let (state, error): (String, String) =
        sqlx::query_as("SELECT state::text, last_error FROM outbox_all_tasks WHERE id = $1")
            .bind(ids[0].0)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (state.as_str(), error.as_str()),
        ("failed", "bytes \u{FFFD}\u{1} from a device")
    );
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.poison.refused", queue = "poison-refused", retry_delays = ["1h", "1h"])]
struct Refused {
    n: u32,
}

struct Succeed;

impl TaskHandler<Refused> for Succeed {
    async fn handle(&self, _ctx: TaskContext, _task: Refused) -> HandlerResult {
        Ok(Outcome::Success)
    }
}

#[tokio::test]
async fn an_outcome_the_database_refuses_for_good_is_recorded_as_a_failure_not_dropped() {
    let db = TestDb::migrated().await;
    // The database will refuse to record task n = 3 completed (a
    // constraint violation on the history it moves to: permanent, unlike a
    // lost connection).
    sqlx::raw_sql(
        "ALTER TABLE outbox_task_history ADD CONSTRAINT refuse_three \
         CHECK (payload <> '{\"n\": 3}'::jsonb)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let ids = outbox::submit_batch(&mut *db.conn().await, (0..6).map(|n| Refused { n }))
        .await
        .unwrap();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Refused>(Succeed)
            .queue("poison-refused", 6)
            .build()
            .unwrap(),
    );
    worker
        .wait_for_all(
            &[(TaskEventKind::Completed, 5), (TaskEventKind::Failed, 1)],
            Duration::from_secs(20),
        )
        .await;
    worker.stop().await;
    let (state, retries, error, claimed_by): (String, i32, String, Option<String>) =
        sqlx::query_as(
            "SELECT state::text, retry_count, last_error, claimed_by FROM outbox_all_tasks WHERE id = $1",
        )
        .bind(ids[3].0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!((state.as_str(), retries, claimed_by), ("failed", 1, None));
    assert!(
        error.contains("the database rejected this attempt's outcome")
            && error.contains("refuse_three"),
        "{error}"
    );
    assert_eq!(
        db.count_by_state().await,
        vec![("completed".to_owned(), 5), ("failed".to_owned(), 1)]
    );
}
