//! Results: what a handler returns with `Outcome::success_with` is stored
//! on the task and read back typed.

use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, Worker, outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.results.report", queue = "result-tests", retry_delays = ["1h"])]
struct BuildReport {
    rows: u64,
    /// Return a result too large to keep.
    huge: bool,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Report {
    rows: u64,
    url: String,
}

struct Builder;

impl TaskHandler<BuildReport> for Builder {
    async fn handle(&self, ctx: TaskContext, task: BuildReport) -> HandlerResult {
        if task.huge {
            return Outcome::success_with(&"x".repeat(outbox::MAX_RESULT_BYTES + 1));
        }
        Outcome::success_with(&Report {
            rows: task.rows,
            url: format!("https://reports.example.com/{}", ctx.id()),
        })
    }
}

#[tokio::test]
async fn a_result_round_trips_typed_and_a_too_large_one_fails_the_attempt() {
    let db = TestDb::migrated().await;
    let ok = outbox::submit(
        &mut *db.conn().await,
        BuildReport {
            rows: 3,
            huge: false,
        },
    )
    .await
    .unwrap();
    let huge = outbox::submit(
        &mut *db.conn().await,
        BuildReport {
            rows: 0,
            huge: true,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        outbox::result::<Report>(&mut *db.conn().await, ok)
            .await
            .unwrap(),
        None,
        "no result before the task completed"
    );
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<BuildReport>(Builder)
            .build()
            .unwrap(),
    );
    worker
        .wait_for_all(
            &[(TaskEventKind::Completed, 1), (TaskEventKind::Dead, 1)],
            Duration::from_secs(20),
        )
        .await;
    worker.stop().await;

    let report = outbox::result::<Report>(&mut *db.conn().await, ok)
        .await
        .unwrap();
    assert_eq!(
        report,
        Some(Report {
            rows: 3,
            url: format!("https://reports.example.com/{ok}")
        })
    );
    let record = outbox::admin::get_task(&db.pool, ok)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.result.as_ref().unwrap()["rows"], 3);

    let wrong = outbox::result::<Vec<u8>>(&mut *db.conn().await, ok)
        .await
        .unwrap_err();
    assert!(
        matches!(wrong, outbox::Error::ResultDecode { .. }),
        "{wrong}"
    );
    assert!(
        wrong.to_string().contains("rows"),
        "the stored JSON is shown: {wrong}"
    );

    let failed = outbox::admin::get_task(&db.pool, huge)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failed.state, "dead", "one attempt allowed");
    assert!(
        failed
            .last_error
            .as_deref()
            .unwrap()
            .contains("the most a task keeps is 65536"),
        "{failed:?}"
    );
    assert!(failed.result.is_none());
    assert_eq!(
        outbox::result::<Report>(&mut *db.conn().await, outbox::TaskId(i64::MAX))
            .await
            .unwrap(),
        None
    );
}
