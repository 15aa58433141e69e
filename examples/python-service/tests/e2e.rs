//! Drives the Python service example for real: `service.py` under Debian's
//! python3 with psycopg, submitting with outbox_submit in its own
//! transactions, and the Rust worker process running what it submitted. A
//! signup whose insert fails leaves no task behind.

use std::process::{Command, Stdio};
use std::time::Duration;

use outbox_tests::TestDb;
use outbox_tests::process::{ServerProcess, WorkerProcess, wait_until};

const WORKER: &str = env!("CARGO_BIN_EXE_welcome-worker");
const SERVICE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/service.py");

/// A python3 that can import psycopg: on PATH, or Debian's (which a pyenv
/// or venv python3 on PATH hides). None skips on a developer's machine
/// without one; in CI (where `.ci/install-python` installs it) it fails.
fn python() -> Option<&'static str> {
    let found = ["python3", "/usr/bin/python3"].into_iter().find(|python| {
        Command::new(python)
            .args(["-c", "import psycopg"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 with psycopg is missing, and CI is set: run .ci/install-python"
        );
        eprintln!(
            "skipping: python3 with psycopg is missing (bash .ci/install-python installs it)"
        );
    }
    found
}

#[tokio::test]
async fn signups_from_python_are_welcomed_by_the_rust_worker_and_a_failed_one_leaves_no_task() {
    let Some(python) = python() else {
        return;
    };
    let db = TestDb::migrated().await;
    sqlx::raw_sql(python_service_example::SCHEMA)
        .execute(&db.pool)
        .await
        .unwrap();
    let mut worker = WorkerProcess::spawn(WORKER, &db.url, &["--queue", "email=4"]);
    // The Python side names only the type: the worker's declaration gives
    // the rest.
    wait_until(
        &db.pool,
        "SELECT EXISTS (SELECT 1 FROM outbox_task_types WHERE task_type = 'email.welcome')",
        Duration::from_secs(60),
    )
    .await;

    let port = outbox_tests::brokers::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut service = Command::new(python);
    service
        .arg(SERVICE)
        // libpq's URL, without sqlx's own parameters.
        .env("DATABASE_URL", db.url.split('?').next().unwrap())
        .env("SERVICE_ADDR", &addr);
    let _service = ServerProcess::start(service, &addr).await;

    let client = reqwest::Client::new();
    let signup = async |email: &str| {
        let response = client
            .post(format!("http://{addr}/signup"))
            .json(&serde_json::json!({ "email": email }))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<serde_json::Value>().await.unwrap())
    };
    let mut submitted = Vec::new();
    for n in 0..5 {
        let (status, body) = signup(&format!("user{n}@example.com")).await;
        assert_eq!(status, 201, "{body}");
        submitted.push((
            body["user_id"].as_i64().unwrap(),
            body["task_id"].as_i64().unwrap(),
        ));
    }
    let (status, body) = signup("user0@example.com").await;
    assert_eq!(status, 409, "the email is taken: {body}");

    wait_until(
        &db.pool,
        "SELECT count(*) = 5 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(60),
    )
    .await;
    let mut welcomed: Vec<(i64, i64)> =
        sqlx::query_as("SELECT user_id, task_id FROM welcomes ORDER BY user_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    welcomed.sort_unstable();
    submitted.sort_unstable();
    assert_eq!(
        welcomed, submitted,
        "each user welcomed by the task submitted with it"
    );
    assert_eq!(
        db.task_count().await,
        5,
        "the failed signup's task rolled back with it"
    );
    worker.terminate_within(Duration::from_secs(10)).await;
}
