//! The CLI through a real PgBouncer in transaction mode (`--pooler`):
//! migrate an empty database, run a worker with its relay, and operate it
//! (submit, list, show, explain, retry, cancel, stats, queues, workers,
//! workflows, events) while two server sessions change hands between all
//! of them.

use std::time::Duration;

use outbox_tests::TestDb;
use outbox_tests::pooler::Pgbouncer;
use outbox_tests::process::WorkerProcess;
use serde_json::Value;

mod common;

use common::{BIN, cli, ok, stderr};

/// Runs `command` through the pooler at `url` (with `--pooler`).
async fn through(url: &str, command: &[&str]) -> std::process::Output {
    let mut args = command.to_vec();
    args.extend(["--database-url", url, "--pooler"]);
    cli(&args).await
}

async fn json(url: &str, command: &[&str]) -> Value {
    serde_json::from_str(&ok(&through(url, command).await)).expect("the command printed JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_through_pgbouncer_with_pooler() {
    let db = TestDb::empty().await;
    let Some(bouncer) = Pgbouncer::start(2).await else {
        return;
    };
    let url = bouncer.url(&db.url);
    let url = url.as_str();

    let migrated = ok(&through(url, &["migrate"]).await);
    assert!(migrated.contains("applied migrations"), "{migrated}");

    let mut worker = WorkerProcess::spawn(
        BIN,
        url,
        &[
            "--pooler",
            "--queue",
            "default=4",
            "--poll-interval",
            "100ms",
        ],
    );
    let mut ids = Vec::new();
    for payload in [r#"{"ms": 10}"#, r#"{"ms": 20}"#, r#"{"ms": 30}"#] {
        let submitted = json(url, &["tasks", "submit", "outbox.sleep", payload, "--json"]).await;
        ids.push(submitted["id"].as_i64().expect("an id"));
    }
    let failing = json(
        url,
        &[
            "tasks",
            "submit",
            "outbox.fail",
            r#"{"times": 100, "message": "no"}"#,
            "--json",
        ],
    )
    .await["id"]
        .as_i64()
        .expect("an id");
    // What the cancel and the retry act on: due in an hour, so it is still
    // waiting whenever they come (the failing task dies after four quick
    // attempts, and a dead task is not cancelled again: on a slow machine
    // the cancel came after its death and the test failed).
    let waiting = json(
        url,
        &[
            "tasks",
            "submit",
            "outbox.noop",
            "{}",
            "--delay",
            "1h",
            "--json",
        ],
    )
    .await["id"]
        .as_i64()
        .expect("an id");

    // Every sleep completes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let stats = json(url, &["stats", "--json"]).await;
        if stats["totals"]["completed"].as_i64() == Some(3) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{stats}\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let listed = ok(&through(url, &["tasks", "list", "--json"]).await);
    assert!(listed.contains("outbox.sleep"), "{listed}");
    let (id, failing, waiting) = (ids[0].to_string(), failing.to_string(), waiting.to_string());
    for command in [
        vec!["tasks", "show", id.as_str()],
        vec!["tasks", "explain", failing.as_str()],
        vec!["tasks", "cancel", waiting.as_str()],
        vec!["tasks", "retry", waiting.as_str()],
        vec!["queues", "pause", "default"],
        vec!["queues", "resume", "default"],
        vec!["queues", "list"],
        vec!["workers", "list"],
        vec!["workflows", "list"],
        vec!["periodic", "list"],
        vec!["events", "emit", "order", "7", "placed", r#"{"total": 5}"#],
        vec!["events", "subscriptions"],
        vec!["events", "parked"],
    ] {
        let out = through(url, &command).await;
        assert!(
            out.status.success(),
            "{command:?} through pgbouncer: exit {:?}\n{}",
            out.status.code(),
            stderr(&out)
        );
    }
    worker.signal("TERM");
    let status = worker.wait(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0), "{}", worker.log());
    assert!(
        !worker.log().contains("prepared statement"),
        "{}",
        worker.log()
    );
}

/// A command pointed at the pooler without `--pooler` is a configuration
/// mistake, said as one (exit 2, with the flag to pass), not an outage:
/// PgBouncer refuses a startup parameter sqlx sends to PostgreSQL.
#[tokio::test]
async fn a_command_at_the_pooler_without_pooler_is_told_to_pass_it() {
    let db = TestDb::migrated().await;
    let Some(bouncer) = Pgbouncer::start(1).await else {
        return;
    };
    let url = bouncer.url(&db.url);
    let out = cli(&["stats", "--database-url", &url]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unsupported startup parameter")
            && stderr(&out).contains("pass --pooler (or set OUTBOX_POOLER=1)"),
        "{}",
        stderr(&out)
    );
}

/// `run --listen-url` aimed at the pooler is refused at start (exit 2),
/// where the listener logged it as an outage for ever and the worker only
/// polled.
#[tokio::test]
async fn a_listen_url_that_leads_to_the_pooler_is_refused_at_start() {
    let db = TestDb::migrated().await;
    let Some(bouncer) = Pgbouncer::start(1).await else {
        return;
    };
    let url = bouncer.url(&db.url);
    let run = tokio::process::Command::new(BIN)
        .args([
            "run",
            "--pooler",
            "--database-url",
            &url,
            "--listen-url",
            &url,
        ])
        .env_remove("DATABASE_URL")
        .env("OUTBOX_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("refused at start, not run")
        .expect("the worker's output");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--listen-url: 127.0.0.1:")
            && stderr(&out).contains("LISTEN needs a session of its own"),
        "{}",
        stderr(&out)
    );
}
