//! `tasks signal`: an operator sends the value a task waits for
//! (`ctx.wait_for`) from the shell, through the real binary.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, Worker, WorkerConfig,
    outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

mod common;

use common::{cli, ok, stderr};

/// Waits for an approval, then records who gave it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.cli.approval", queue = "cli-signal")]
struct Approval {}

#[derive(Clone, Default)]
struct Approvals(Arc<Mutex<Vec<serde_json::Value>>>);

impl TaskHandler<Approval> for Approvals {
    async fn handle(&self, ctx: TaskContext, _task: Approval) -> HandlerResult {
        let by: serde_json::Value = ctx.wait_for("approved").await?;
        self.0.lock().unwrap().push(by);
        Ok(Outcome::Success)
    }
}

#[tokio::test]
async fn a_task_waiting_for_a_signal_is_sent_it_from_the_shell_once() {
    let db = TestDb::migrated().await;
    let at = ["--database-url", db.url.as_str()];
    let id = outbox::submit(&mut *db.conn().await, Approval {})
        .await
        .unwrap();
    let approvals = Approvals::default();
    let mut worker = RunningWorker::start(
        // No maintenance: nothing prunes the signal that `tasks show` lists
        // after the task completed.
        Worker::builder(db.pool.clone())
            .config(WorkerConfig {
                maintenance: false,
                ..WorkerConfig::default()
            })
            .handler::<Approval>(approvals.clone())
            .build()
            .unwrap(),
    );
    // Suspended in wait_for: pending again after its first claim.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT coalesce((SELECT state = 'pending' AND claims > 0 \
             FROM outbox_all_tasks WHERE id = $1), false)",
        )
        .bind(id.0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if waiting {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never waited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let id_text = id.to_string();
    let shown = ok(&cli(&["tasks", "show", &id_text, at[0], at[1]]).await);
    assert!(!shown.contains("signal "), "{shown}");
    let bad = cli(&[
        "tasks", "signal", &id_text, "approved", "{nope", at[0], at[1],
    ])
    .await;
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("not valid JSON"), "{}", stderr(&bad));
    let long = "n".repeat(1000);
    let bad = cli(&["tasks", "signal", &id_text, &long, at[0], at[1]]).await;
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("signal name"), "{}", stderr(&bad));

    let sent = ok(&cli(&[
        "tasks",
        "signal",
        &id_text,
        "approved",
        r#"{"by": "ada"}"#,
        at[0],
        at[1],
    ])
    .await);
    assert!(
        sent.contains(&format!("sent signal \"approved\" to task {id}")),
        "{sent}"
    );
    worker
        .wait_for(TaskEventKind::Completed, 1, Duration::from_secs(60))
        .await;
    worker.stop().await;
    assert_eq!(
        *approvals.0.lock().unwrap(),
        [serde_json::json!({"by": "ada"})]
    );

    // `tasks show` lists what it was sent.
    let shown = ok(&cli(&["tasks", "show", &id_text, at[0], at[1]]).await);
    assert!(
        shown.contains(r#"signal        approved = {"by":"ada"} (sent "#),
        "{shown}"
    );
    let shown: serde_json::Value = serde_json::from_str(&ok(&cli(&[
        "tasks", "show", &id_text, "--json", at[0], at[1],
    ])
    .await))
    .unwrap();
    assert_eq!(shown["signals"][0]["name"], "approved");
    assert_eq!(
        shown["signals"][0]["value"],
        serde_json::json!({"by": "ada"})
    );
    // A second of that name: the first is kept, and the refusal says so.
    let again = cli(&["tasks", "signal", &id_text, "approved", at[0], at[1]]).await;
    assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));
    assert!(
        stderr(&again).contains(
            "was not sent signal \"approved\": it was sent one of that name already, at "
        ),
        "{}",
        stderr(&again)
    );
    // Another name to the finished task: nothing would read it.
    let late = cli(&["tasks", "signal", &id_text, "late", at[0], at[1]]).await;
    assert_eq!(late.status.code(), Some(1), "{}", stderr(&late));
    assert!(
        stderr(&late).contains("was not sent signal \"late\": it has finished (state completed)"),
        "{}",
        stderr(&late)
    );
    // No such task.
    let nowhere = cli(&["tasks", "signal", "987654", "approved", at[0], at[1]]).await;
    assert_eq!(nowhere.status.code(), Some(1), "{}", stderr(&nowhere));
    assert!(
        stderr(&nowhere).contains("there is no task with that id"),
        "{}",
        stderr(&nowhere)
    );
}
