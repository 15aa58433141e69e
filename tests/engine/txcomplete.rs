//! `TaskContext::complete_in`: the completion commits with the handler's
//! transaction, and the outcome writer leaves the row alone afterwards.

use std::time::Duration;

use outbox::{
    HandlerError, HandlerResult, TaskContext, TaskEventKind, TaskHandler, Worker, outbox_task,
    testing,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.txcomplete.step", queue = "txcomplete-tests")]
struct Step {
    /// Roll the transaction back instead of committing.
    roll_back: bool,
}

/// A follow-up submitted in the same transaction (a chain).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[outbox_task(task_type = "test.txcomplete.next", queue = "txcomplete-next")]
struct Next {
    after: i64,
}

struct Stepper;

impl TaskHandler<Step> for Stepper {
    async fn handle(&self, ctx: TaskContext, task: Step) -> HandlerResult {
        let mut tx = ctx.pool().begin().await?;
        outbox::submit(&mut tx, Next { after: ctx.id().0 }).await?;
        ctx.complete_in_with_result(&mut tx, &"stepped").await?;
        if task.roll_back {
            tx.rollback().await?;
            return Err(HandlerError::msg("rolled back on purpose"));
        }
        tx.commit().await?;
        // Whatever it returns now, the committed completion stands.
        Err(HandlerError::msg("this error is not written"))
    }
}

#[tokio::test]
async fn a_committed_completion_stands_and_a_rolled_back_one_leaves_the_outcome_to_the_writer() {
    let db = TestDb::migrated().await;
    let done = outbox::submit(&mut *db.conn().await, Step { roll_back: false })
        .await
        .unwrap();
    let undone = outbox::submit(&mut *db.conn().await, Step { roll_back: true })
        .await
        .unwrap();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Step>(Stepper)
            .build()
            .unwrap(),
    );
    let events = worker
        .wait_for_all(
            &[(TaskEventKind::Completed, 1), (TaskEventKind::Failed, 1)],
            Duration::from_secs(20),
        )
        .await;
    worker.stop().await;
    assert!(
        !events.iter().any(|e| e.kind == TaskEventKind::Stale),
        "a completion in the handler's transaction is not a stale outcome: {events:?}"
    );
    let row = outbox::admin::get_task(&db.pool, done)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.state, "completed");
    assert_eq!(row.last_error, None);
    assert_eq!(row.result, Some(serde_json::json!("stepped")));
    let row = outbox::admin::get_task(&db.pool, undone)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.state, "failed");
    assert_eq!(row.last_error.as_deref(), Some("rolled back on purpose"));
    // The chain: the follow-up committed with the first task only.
    let next = testing::submitted::<Next>(&mut *db.conn().await).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].1, Next { after: done.0 });
}

#[tokio::test]
async fn outside_an_attempt_that_holds_the_task_complete_in_is_refused() {
    let db = TestDb::migrated().await;
    let id = outbox::submit(&mut *db.conn().await, Step { roll_back: false })
        .await
        .unwrap();
    let ctx = testing::context::<Step>(&db.pool, id, 1);
    let mut tx = db.pool.begin().await.unwrap();
    let error = ctx.complete_in(&mut tx).await.unwrap_err();
    assert!(
        matches!(error, outbox::Error::NotHeld(held) if held == id),
        "{error}"
    );
}
