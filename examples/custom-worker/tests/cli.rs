//! The custom binary knows its own task type through the stock CLI.

use std::time::Duration;

use outbox_tests::TestDb;
use outbox_tests::process::{WorkerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_custom-worker");

#[tokio::test]
async fn the_cli_submits_and_runs_the_applications_own_task_type() {
    let db = TestDb::migrated().await;
    let submitted = std::process::Command::new(BIN)
        .args([
            "tasks",
            "submit",
            "invoice.send",
            r#"{"invoice_id": 42}"#,
            "--database-url",
            &db.url,
        ])
        .output()
        .unwrap();
    assert!(
        submitted.status.success(),
        "{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let mut worker = WorkerProcess::spawn(
        BIN,
        &db.url,
        &["--queue", "billing=2", "--log-format", "json"],
    );
    wait_until(
        &db.pool,
        "SELECT count(*) = 1 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(30),
    )
    .await;
    worker.signal("TERM");
    assert_eq!(worker.wait(Duration::from_secs(20)).await.code(), Some(0));
    let log = worker.log();
    let line = log
        .lines()
        .find(|l| l.contains("invoice 42 sent"))
        .unwrap_or_else(|| panic!("{log}"));
    for field in [
        "\"task_id\":",
        "\"task_type\":\"invoice.send\"",
        "\"attempt\":1",
    ] {
        assert!(
            line.contains(field),
            "the handler's log line lacks {field}: {line}"
        );
    }
}
