//! The real `outbox-worker` binary against a real PostgreSQL: migrate,
//! the task round trip, refusals with their exit codes, stats, demo and
//! metrics.

use std::time::Duration;

use outbox::{Clock, TaskEventKind, Worker};
use outbox_tests::{RunningWorker, TestDb};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

use common::{BIN, cli, ok, stderr, stdout, submit_noop};

/// Runs a command that prints JSON and parses it.
async fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(&cli(args).await)).expect("the command printed JSON")
}

#[tokio::test]
async fn migrate_twice_reports_the_version_and_changes_nothing_the_second_time() {
    let db = TestDb::empty().await;
    let first = ok(&cli(&["migrate", "--database-url", &db.url]).await);
    assert!(
        first.contains(&format!(
            "applied migrations {:?}; schema is at version {}",
            (1..=outbox::latest_version()).collect::<Vec<_>>(),
            outbox::latest_version()
        )),
        "{first}"
    );
    let second = ok(&cli(&["migrate", "--database-url", &db.url]).await);
    assert!(
        second.contains(&format!(
            "schema is up to date at version {}",
            outbox::latest_version()
        )),
        "{second}"
    );
    // Up to date, it says nothing more, even at INFO (the server's notice
    // of a table that exists used to be logged on every run).
    let third = tokio::process::Command::new(BIN)
        .args(["migrate", "--database-url", &db.url])
        .env_remove("DATABASE_URL")
        .env("OUTBOX_LOG", "info")
        .output()
        .await
        .unwrap();
    assert!(
        !stderr(&third).contains("already exists"),
        "{}",
        stderr(&third)
    );
}

/// `migrate` behind a transaction that holds a table it alters waits at
/// most `--lock-timeout` at a time, then gives up before
/// `--command-timeout` naming the migration, and applies nothing.
#[tokio::test]
async fn migrate_behind_a_long_transaction_gives_up_naming_the_migration() {
    let (db, holder) = TestDb::held_before_migration_43().await;
    let args = [
        "migrate",
        "--database-url",
        &db.url,
        "--lock-timeout",
        "200ms",
        "--command-timeout",
        "10s",
    ];
    refused(
        &args,
        1,
        "migration 43 (runs_held_in_place) waited for a lock",
    )
    .await;
    assert_eq!(outbox::schema_status(&db.pool).await.unwrap().current, 42);
    holder.rollback().await.unwrap();
    let applied = ok(&cli(&args).await);
    assert!(applied.contains("applied migrations [43,"), "{applied}");
}

/// A lock timeout longer than a quarter of the command's is refused, not
/// cut down without a word; left unset, it fits the command's.
#[tokio::test]
async fn migrate_refuses_a_lock_timeout_its_command_timeout_cannot_hold() {
    let db = TestDb::empty().await;
    let mut args = vec![
        "migrate",
        "--database-url",
        &db.url,
        "--lock-timeout",
        "20s",
        "--command-timeout",
        "30s",
    ];
    refused(
        &args,
        2,
        "--lock-timeout (20s) must be at most a quarter of --command-timeout (30s): lower it, \
         or raise --command-timeout to at least 1m 20s",
    )
    .await;
    assert_eq!(outbox::schema_status(&db.pool).await.unwrap().current, 0);
    // The default (2 s) fits a short command timeout by shrinking to it.
    args.drain(3..5);
    args[4] = "4s";
    let applied = ok(&cli(&args).await);
    assert!(applied.contains("applied migrations [1,"), "{applied}");
}

/// A listing whose reader has gone (`tasks list | head -1`) ends with
/// success and says nothing, not with a panic and exit code 101.
#[tokio::test]
async fn a_listing_whose_reader_went_away_ends_quietly() {
    let db = TestDb::migrated().await;
    for _ in 0..3 {
        submit_noop(&db.url).await;
    }
    let mut listing = tokio::process::Command::new(BIN)
        .args(["tasks", "list", "--database-url", &db.url])
        .env_remove("DATABASE_URL")
        .env("OUTBOX_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before it prints: it connects to the database first.
    drop(listing.stdout.take());
    let out = listing.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}

#[tokio::test]
async fn submit_list_show_retry_cancel_round_trip() {
    let db = TestDb::migrated().await;
    let url = db.url.as_str();
    let doomed = ok(&cli(&[
        "tasks",
        "submit",
        "outbox.fail",
        r#"{"times": 99, "message": "nope"}"#,
        "--database-url",
        url,
    ])
    .await);
    let doomed = doomed.trim().to_owned();
    let later = ok(&cli(&[
        "tasks",
        "submit",
        "outbox.noop",
        "{}",
        "--delay",
        "1h",
        "--priority",
        "3",
        "--max-attempts",
        "7",
        "--database-url",
        url,
    ])
    .await);
    let later = later.trim().to_owned();
    let shown_later = ok(&cli(&["tasks", "show", &later, "--database-url", url]).await);
    assert!(
        shown_later.contains("attempts      0 failed of 7 allowed"),
        "{shown_later}"
    );

    let shown = ok(&cli(&["tasks", "show", &doomed, "--database-url", url]).await);
    assert!(
        shown.contains("state         pending") && shown.contains("\"message\": \"nope\""),
        "{shown}"
    );

    // Run the doomed task to death on a pinned clock moved past each delay.
    let clock = Clock::fixed(chrono::Utc::now() + chrono::Duration::minutes(1));
    let mut worker = RunningWorker::start(
        outbox_worker::builtin::register(Worker::builder(db.pool.clone()))
            .clock(clock.clone())
            .poll_interval(Duration::from_millis(20))
            .build()
            .unwrap(),
    );
    for _ in 0..2 {
        worker
            .wait_for(TaskEventKind::Failed, 1, Duration::from_secs(20))
            .await;
        clock.advance(Duration::from_secs(10));
    }
    worker
        .wait_for(TaskEventKind::Dead, 1, Duration::from_secs(20))
        .await;
    worker.stop().await;

    let listed: Value = json(&["tasks", "list", "--dead", "--json", "--database-url", url]).await;
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"].to_string(), doomed);
    assert_eq!(listed[0]["state"], "dead");
    assert_eq!(listed[0]["last_error"], "nope");
    assert_eq!(listed[0]["retry_count"], 3);
    let table = ok(&cli(&[
        "tasks",
        "list",
        "--type",
        "outbox.noop",
        "--database-url",
        url,
    ])
    .await);
    assert!(
        table.contains(&later) && table.contains("pending") && !table.contains("outbox.fail"),
        "{table}"
    );
    let list_queue = ["tasks", "list", "--json", "--database-url", url, "--queue"];
    let default = json(&[&list_queue[..], &["default"]].concat()).await;
    assert!(
        default
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["queue"] == "default")
            && default.as_array().unwrap().len() >= 2,
        "{default}"
    );
    assert_eq!(
        json(&[&list_queue[..], &["nosuch"]].concat()).await,
        serde_json::json!([])
    );

    let retried = ok(&cli(&["tasks", "retry", &doomed, "--database-url", url]).await);
    assert!(
        retried.contains(&format!("retried 1 task(s): {doomed}")),
        "{retried}"
    );
    let after: Value = json(&["tasks", "show", &doomed, "--json", "--database-url", url]).await;
    assert_eq!(
        (after["state"].as_str(), after["retry_count"].as_i64()),
        (Some("pending"), Some(0))
    );

    // A scheduled task retried is due now, its budget untouched.
    let run_now = ok(&cli(&["tasks", "retry", &later, "--database-url", url]).await);
    assert!(
        run_now.contains(&format!("retried 1 task(s): {later}")),
        "{run_now}"
    );
    let now_due: Value = json(&["tasks", "show", &later, "--json", "--database-url", url]).await;
    let due_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(now_due["execute_at"].clone()).unwrap();
    assert!(due_at <= chrono::Utc::now(), "{now_due}");
    assert_eq!(now_due["max_attempts"].as_i64(), Some(7));
    let again = cli(&["tasks", "retry", &later, "--database-url", url]).await;
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains(&format!("not retried: {later} (due already)")),
        "{}",
        stderr(&again)
    );

    let cancelled = ok(&cli(&["tasks", "cancel", &doomed, &later, "--database-url", url]).await);
    assert!(cancelled.contains("cancelled 2 task(s)"), "{cancelled}");
    let gone: Value = json(&["tasks", "show", &later, "--json", "--database-url", url]).await;
    assert_eq!(
        (gone["state"].as_str(), gone["last_error"].as_str()),
        (Some("dead"), Some("cancelled by an operator"))
    );

    let missing = cli(&["tasks", "retry", "999999", "--database-url", url]).await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("not retried: 999999 (no such task)"),
        "{}",
        stderr(&missing)
    );

    let all_dead = ok(&cli(&[
        "tasks",
        "retry",
        "--dead",
        "--type",
        "outbox.fail",
        "--database-url",
        url,
    ])
    .await);
    assert!(
        all_dead.contains(&format!("retried 1 dead task(s): {doomed}")),
        "{all_dead}"
    );
    // A misspelt type retries nothing either: the hint tells it apart.
    let typo = cli(&[
        "tasks",
        "retry",
        "--dead",
        "--type",
        "outbox.fial",
        "--database-url",
        url,
    ])
    .await;
    assert!(typo.status.success(), "{}", stderr(&typo));
    assert!(
        stderr(&typo).contains(
            "no worker declares task type \"outbox.fial\", and this binary does not register it"
        ) && stderr(&typo).contains("outbox.fail"),
        "{}",
        stderr(&typo)
    );
    let none_dead = cli(&[
        "tasks",
        "retry",
        "--dead",
        "--type",
        "outbox.fail",
        "--database-url",
        url,
    ])
    .await;
    assert!(
        !stderr(&none_dead).contains("no worker declares"),
        "{}",
        stderr(&none_dead)
    );
}

/// Runs a command that must be refused with `code`, saying `needle`.
async fn refused(args: &[&str], code: i32, needle: &str) {
    let out = cli(args).await;
    assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
    assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
}

#[tokio::test]
async fn refusals_have_clear_messages_distinct_exit_codes_and_write_nothing() {
    let db = TestDb::migrated().await;
    let at = ["--database-url", db.url.as_str()];
    let submit = |task_type: &'static str, payload: &'static str| {
        let mut args = vec!["tasks", "submit", task_type, payload];
        args.extend(at);
        args
    };

    // No database at all: both ways to give one are named.
    for command in [&["stats"][..], &["tasks", "list"], &["run"]] {
        refused(command, 2, "set DATABASE_URL or pass --database-url").await;
    }
    refused(
        &submit("nope.nothing", "{}"),
        2,
        "unknown task type \"nope.nothing\"",
    )
    .await;
    refused(
        &submit("nope.nothing", "{}"),
        2,
        "outbox.fail, outbox.noop, outbox.sleep",
    )
    .await;
    refused(
        &submit("outbox.noop", "{not json"),
        2,
        "the payload is not valid JSON",
    )
    .await;
    refused(
        &submit("outbox.sleep", r#"{"ms": "soon"}"#),
        2,
        "does not fit task type \"outbox.sleep\"",
    )
    .await;
    let mut bad_priority = submit("outbox.noop", "{}");
    bad_priority.extend(["--priority", "42"]);
    refused(&bad_priority, 2, "42 is not in 0..=9").await;
    refused(
        &["run", "--queue", "default=0", at[0], at[1]],
        2,
        "is not a whole number from 1 to 100000",
    )
    .await;
    assert_eq!(db.task_count().await, 0, "no refusal wrote anything");

    let nowhere = "postgres://postgres@127.0.0.1:1/nothing";
    refused(
        &["stats", "--database-url", nowhere],
        3,
        "connection refused by 127.0.0.1:1",
    )
    .await;
    // A database that does not exist: the server's message, without the
    // source line its error carries.
    let (server, rest) = db.url.rsplit_once('/').expect("a URL with a path");
    let query = rest
        .split_once('?')
        .map_or(String::new(), |(_, q)| format!("?{q}"));
    let missing = format!("{server}/no_such_database{query}");
    let out = cli(&["stats", "--database-url", &missing]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let message = stderr(&out);
    assert!(
        message.contains("refused the connection: database \"no_such_database\" does not exist (check --database-url or DATABASE_URL)")
            && !message.contains(" at line "),
        "{message}"
    );

    let empty = TestDb::empty().await;
    for command in [&["run"][..], &["tasks", "list"], &["stats"]] {
        let mut args = command.to_vec();
        args.extend(["--database-url", empty.url.as_str()]);
        // The binary as it was invoked (its path here).
        refused(&args, 4, &format!("run `{BIN} migrate` first")).await;
    }
}

#[tokio::test]
async fn every_numeric_flag_is_checked_against_its_range_and_none_panics() {
    let db = TestDb::migrated().await;
    let at = ["--database-url", db.url.as_str()];
    let cases: &[(&[&str], &str)] = &[
        (&["run", "--max-connections", "0"], "0 is not in 1..=10000"),
        (
            &["run", "--max-connections", "99999999999"],
            "is not in 1..=10000",
        ),
        (
            &["run", "--queue", "default=2305843009213693952"],
            "is not a whole number from 1 to 100000",
        ),
        (&["run", "--queue", "=4"], "no queue name"),
        (
            &["run", "--heartbeat-interval", "0s"],
            "out of range: use 100ms to 1h",
        ),
        (&["run", "--heartbeat-timeout", "100000d"], "out of range"),
        (
            &["run", "--heartbeat-timeout", "100years"],
            "write days (30d)",
        ),
        (
            &["run", "--poll-interval", "0s"],
            "out of range: use 1ms to 1h",
        ),
        (&["run", "--maintenance-interval", "1ms"], "out of range"),
        (&["run", "--statement-timeout", "0s"], "out of range"),
        (&["run", "--keepalive", "10ms"], "out of range"),
        (&["run", "--flush-timeout", "2h"], "out of range"),
        (&["run", "--retention", "99999d"], "out of range"),
        (
            &["run", "--history-partition", "30s"],
            "out of range: use 1m to 366d",
        ),
        (
            &["run", "--vacuum-threshold", "1000000001"],
            "1000000001 is not in 0..=1000000000",
        ),
        (
            &["run", "--claim-ahead", "100001"],
            "100001 is not in 0..=100000",
        ),
        (&["run", "--claim-ahead=-1"], "-1 is not in 0..=100000"),
        // A negative number is the flag's value, refused by its range
        // (not taken for an unknown argument).
        (&["run", "--key-run", "-1"], "-1 is not in 1..=10000"),
        (
            &["tasks", "list", "--limit", "-1"],
            "-1 is not in 1..=100000",
        ),
        (
            &["tasks", "submit", "outbox.noop", "{}", "--priority", "-1"],
            "-1 is not in 0..=9",
        ),
        (&["run", "--key-run", "0"], "0 is not in 1..=10000"),
        (
            &[
                "tasks",
                "submit",
                "outbox.noop",
                "{}",
                "--max-attempts",
                "0",
            ],
            "0 is not in 1..=10000",
        ),
        (
            &[
                "tasks",
                "submit",
                "outbox.noop",
                "{}",
                "--max-attempts",
                "10001",
            ],
            "10001 is not in 1..=10000",
        ),
        (
            &["bench", "--key-run", "10001"],
            "10001 is not in 1..=10000",
        ),
        (&["run", "--claim-ahead-window", "0ms"], "out of range"),
        (&["bench", "--claim-ahead-window", "2h"], "out of range"),
        (&["bench", "--claim-ahead-window", "-5ms"], "is negative"),
        (&["run", "--warn-snapshot-age", "0s"], "out of range"),
        (&["run", "--dead-retention", "30m"], "out of range"),
        (&["migrate", "--lock-timeout", "50ms"], "out of range"),
        (&["run", "--retry-jitter", "101"], "101 is not in 0..=100"),
        (&["migrate", "--lock-timeout", "2m"], "out of range"),
        (&["run", "--dead-retention", "3651d"], "out of range"),
        (&["run", "--event-log-max-age", "23h"], "out of range"),
        (
            &["bench", "--relay-delayed-events", "10000001"],
            "10000001 is not in 0..=10000000",
        ),
        (
            &["bench", "--claim-ahead", "1e9"],
            "\"1e9\" is not a whole number in 0..=",
        ),
        (
            &["bench", "--fan-in", "100000"],
            "100000 is not in 0..=99999",
        ),
        (
            &["bench", "--workflow-steps", "10000001"],
            "10000001 is not in 0..=10000000",
        ),
        (
            &["bench", "--held-snapshot-seconds", "86401"],
            "86401 is not in 0..=86400",
        ),
        (
            &["bench", "--relay-held-seconds", "0"],
            "0 is not in 1..=3600",
        ),
        (
            &["run", "--shutdown-grace=-1s"],
            "-1s is negative: use 0s to",
        ),
        (&["run", "--shutdown-grace=soon"], "is not a duration"),
        // --type filters --dead, alone or with ids.
        (
            &["tasks", "retry", "--type", "outbox.noop"],
            "give it with --dead (tasks retry --dead --type TYPE)",
        ),
        (
            &["tasks", "retry", "7", "--type", "outbox.noop"],
            "give it with --dead",
        ),
        // A negative duration as its own word is the flag's value too.
        (
            &["run", "--shutdown-grace", "-1s"],
            "-1s is negative: use 0s to",
        ),
        (
            &["tasks", "submit", "outbox.noop", "{}", "--delay", "-1s"],
            "-1s is negative: use",
        ),
        (
            &["events", "emit", "order", "1", "t", "{}", "--delay", "-5m"],
            "-5m is negative: use",
        ),
        (
            &[
                "run",
                "--heartbeat-interval",
                "1m",
                "--heartbeat-timeout",
                "30s",
            ],
            "must be longer than",
        ),
        (&["tasks", "list", "--limit=-5"], "-5 is not in 1..=100000"),
        (&["tasks", "list", "--limit", "0"], "0 is not in 1..=100000"),
        (
            &[
                "tasks",
                "submit",
                "outbox.noop",
                "{}",
                "--delay",
                "999999999d",
            ],
            "out of range",
        ),
        (
            &["tasks", "submit", "outbox.noop", "{}", "--delay", "1M"],
            "\"M\" is a month, not a minute",
        ),
        (
            &["tasks", "submit", "outbox.noop", "{}", "--priority=-1"],
            "-1 is not in 0..=9",
        ),
        (&["demo", "--concurrency", "0"], "0 is not in 1..=100000"),
        (&["demo", "--tasks", "-1"], "-1 is not in 0..=10000000"),
        (&["bench", "--tasks", "0"], "0 is not in 1..=100000000"),
        (
            &["bench", "--submitters", "18446744073709551616"],
            "18446744073709551616 is not in 1..=1000",
        ),
    ];
    for (args, needle) in cases {
        let mut args = args.to_vec();
        args.extend(at);
        let out = cli(&args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("panicked"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert_eq!(db.task_count().await, 0);
}

#[tokio::test]
async fn payloads_come_from_an_argument_stdin_or_a_file_and_unstorable_ones_are_refused() {
    let db = TestDb::migrated().await;
    let url = db.url.as_str();
    let dir = std::env::temp_dir().join(format!("outbox-cli-payload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("payload.json");
    std::fs::write(&file, r#"{"ms": 7}"#).unwrap();
    let at_file = format!("@{}", file.display());
    ok(&cli(&[
        "tasks",
        "submit",
        "outbox.sleep",
        &at_file,
        "--database-url",
        url,
    ])
    .await);

    let mut child = tokio::process::Command::new(BIN)
        .args([
            "tasks",
            "submit",
            "outbox.sleep",
            "-",
            "--database-url",
            url,
        ])
        .env_remove("DATABASE_URL")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(br#"{"ms": 8}"#).await.unwrap();
    drop(stdin);
    ok(&child.wait_with_output().await.unwrap());
    let payloads: Vec<String> =
        sqlx::query_scalar("SELECT payload::text FROM outbox_all_tasks ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(payloads, [r#"{"ms": 7}"#, r#"{"ms": 8}"#]);

    // PostgreSQL's jsonb cannot hold U+0000: refused before anything is sent.
    refused(
        &[
            "tasks",
            "submit",
            "outbox.noop",
            r#"{"note": "a\u0000b"}"#,
            "--database-url",
            url,
        ],
        2,
        "U+0000",
    )
    .await;
    let big = dir.join("big.json");
    let huge = format!(r#"{{"pad": "{}"}}"#, "x".repeat(17 * 1024 * 1024));
    std::fs::write(&big, huge).unwrap();
    let at_big = format!("@{}", big.display());
    refused(
        &[
            "tasks",
            "submit",
            "outbox.noop",
            &at_big,
            "--database-url",
            url,
        ],
        2,
        "larger than the 16 MiB",
    )
    .await;
    refused(
        &[
            "tasks",
            "submit",
            "outbox.noop",
            "@/no/such/file",
            "--database-url",
            url,
        ],
        2,
        "cannot read the payload file",
    )
    .await;
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(db.task_count().await, 2, "the refusals wrote nothing");
}

#[tokio::test]
async fn operator_mistakes_fail_at_start_up_and_a_stuck_command_gives_up() {
    let db = TestDb::migrated().await;
    let at = ["--database-url", db.url.as_str()];
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["run", "--metrics-addr", &taken_addr],
            "cannot serve metrics on",
        ),
        (
            vec!["run", "--queue", "a=1,a=2"],
            "queue \"a\" is given twice",
        ),
        (vec!["stats", "--log", "outbox=[[["], "is not a log filter"),
        (
            vec![
                "run",
                "--no-maintenance",
                "--periodic",
                "tick=every 1s outbox.noop {}",
            ],
            "declared on a worker without maintenance",
        ),
    ];
    for (mut args, needle) in cases {
        args.extend(at);
        refused(&args, 2, needle).await;
    }
    refused(
        &["stats", "--database-url", "mysql://x@127.0.0.1/db"],
        2,
        "must start with postgres://",
    )
    .await;

    // A misspelled queue starts (tasks may be submitted to any queue) but
    // says so at once.
    let mut misspelled =
        outbox_tests::process::WorkerProcess::spawn(BIN, &db.url, &["--queue", "mial=4"]);
    let log = misspelled
        .wait_for_log(
            "no task type this worker handles has this queue",
            Duration::from_secs(20),
        )
        .await;
    assert!(log.contains("queue=mial"), "{log}");
    drop(misspelled);

    // A table lock holds `stats`: it gives up after --command-timeout. (The
    // intake too: a single submit writes there.)
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox_tasks, outbox_intake IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut args = vec!["stats", "--command-timeout", "2s"];
    args.extend(at);
    let out = cli(&args).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("did not finish this command within 2s"),
        "{err}"
    );
    // The command's own error, not sqlx's warning quoting the statement.
    assert!(!err.contains("slow statement"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // A write held before its COMMIT says that it wrote nothing. (Long
    // enough for connecting and the schema check on a loaded machine: the
    // lock holds the write itself however long it is.)
    let mut args = vec![
        "tasks",
        "submit",
        "outbox.noop",
        "{}",
        "--command-timeout",
        "8s",
    ];
    args.extend(at);
    let out = cli(&args).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("nothing was written"), "{err}");
    tx.rollback().await.unwrap();
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(tasks, 0);
    drop(taken);
}

/// A TCP server on loopback that answers every connection with `reply`
/// and closes it (`None`: accepts and says nothing).
async fn fake_server(reply: Option<&'static [u8]>) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            match reply {
                Some(bytes) => {
                    let mut buf = [0u8; 64];
                    let _ = socket.read(&mut buf).await;
                    let _ = socket.write_all(bytes).await;
                }
                None => open.push(socket),
            }
        }
    });
    (port, task)
}

#[tokio::test]
async fn an_unreachable_or_foreign_server_is_named_within_seconds_with_exit_3() {
    let (http, http_task) = fake_server(Some(b"HTTP/1.1 400 Bad Request\r\n\r\n")).await;
    let (silent, silent_task) = fake_server(None).await;
    // Bound but not listening: connections are refused, and no other
    // process can take the port while the test runs.
    let refusing = tokio::net::TcpSocket::new_v4().unwrap();
    refusing.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let refused_port = refusing.local_addr().unwrap().port();
    // Each bound includes starting the binary on a possibly loaded
    // machine: the quick answers stay under the 5 s connect timeout (they
    // did not wait for it), the silent server's goes little past it.
    let cases = [
        (
            refused_port,
            "connection refused by",
            Duration::from_secs(4),
        ),
        (http, "is this a PostgreSQL server", Duration::from_secs(4)),
        (silent, "no answer from", Duration::from_secs(10)),
    ];
    for (port, needle, within) in cases {
        let url = format!("postgres://postgres@127.0.0.1:{port}/db");
        let started = std::time::Instant::now();
        let out = cli(&["stats", "--database-url", &url]).await;
        let took = started.elapsed();
        assert_eq!(out.status.code(), Some(3), "{url}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(needle) || err.contains("does not speak the PostgreSQL protocol"),
            "{url}: {err}"
        );
        assert!(took < within, "{url}: took {took:?}");
        eprintln!("unreachable: {needle:?} reported in {took:?}");
    }
    http_task.abort();
    silent_task.abort();
}

#[tokio::test]
async fn stats_json_has_the_documented_fields() {
    let db = TestDb::migrated().await;
    submit_noop(&db.url).await;
    ok(&cli(&[
        "tasks",
        "submit",
        "outbox.sleep",
        r#"{"ms": 5}"#,
        "--delay",
        "1h",
        "--database-url",
        &db.url,
    ])
    .await);
    let stats: Value =
        serde_json::from_str(&ok(
            &cli(&["stats", "--json", "--database-url", &db.url]).await
        ))
        .unwrap();
    for field in [
        "totals",
        "by_type",
        "dead",
        "in_flight",
        "claimable",
        "scheduled",
        "blocked",
        "oldest_claimable_age_seconds",
        "oldest_heartbeat_age_seconds",
        "dead_tuples",
        "live_tuples",
        "oldest_snapshot_age_seconds",
        "oldest_snapshot_holder",
    ] {
        assert!(stats.get(field).is_some(), "missing {field}: {stats}");
    }
    assert_eq!(stats["totals"]["pending"], 2);
    assert_eq!(stats["by_type"]["outbox.noop"]["pending"], 1);
    // Every state is there for every type, zeros included, as in totals.
    assert_eq!(
        stats["by_type"]["outbox.noop"],
        serde_json::json!({"pending": 1, "processing": 0, "completed": 0, "failed": 0, "dead": 0})
    );
    assert_eq!(
        (stats["claimable"].as_i64(), stats["scheduled"].as_i64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        (stats["dead"].as_i64(), stats["in_flight"].as_i64()),
        (Some(0), Some(0))
    );
    let text = ok(&cli(&["stats", "--database-url", &db.url]).await);
    assert!(
        text.contains("outbox.sleep") && text.contains("claimable now: 1"),
        "{text}"
    );
}

#[tokio::test]
async fn demo_completes_against_a_given_database() {
    let db = TestDb::empty().await;
    let out = tokio::process::Command::new(BIN)
        .args(["demo", "--tasks", "200", "--no-progress"])
        .env("DATABASE_URL", &db.url)
        // As `cargo run` starts an application's own binary (main_with).
        .env("CARGO_PKG_NAME", "my-app")
        .output()
        .await
        .unwrap();
    let text = ok(&out);
    assert!(text.contains("273 of 273 tasks finished"), "{text}");
    // Run by cargo, the suggestions reach the binary through cargo, by its
    // own package's name.
    assert!(
        text.contains(
            "cargo run -p my-app --bin outbox-worker -- tasks retry --dead --type outbox.fail"
        ),
        "{text}"
    );
    let dead: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks WHERE dead_at IS NOT NULL")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(dead, 3, "the demo's poison tasks are kept, dead");
}

async fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    Some(response)
}

/// Scrapes /metrics until every line of `wanted` is in it (30 s at most);
/// returns the response.
async fn scrape_until(
    port: u16,
    wanted: &[&str],
    worker: &outbox_tests::process::WorkerProcess,
) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let body = http_get(port, "/metrics").await.unwrap_or_default();
        if wanted.iter().all(|w| body.contains(w)) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "metrics never showed {wanted:?}:\n{body}\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn metrics_serve_the_documented_series_while_tasks_run() {
    let db = TestDb::migrated().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut batch = outbox::Batch::new();
    for _ in 0..20 {
        batch.push(&outbox_worker::builtin::Noop {}).unwrap();
    }
    for _ in 0..4 {
        batch
            .push(&outbox_worker::builtin::Sleep { ms: 60_000 })
            .unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    let addr = format!("127.0.0.1:{port}");
    let mut worker = outbox_tests::process::WorkerProcess::spawn(
        BIN,
        &db.url,
        &[
            "--metrics-addr",
            &addr,
            "--queue",
            "default=8",
            "--shutdown-grace",
            "1s",
        ],
    );
    let wanted = [
        "outbox_tasks_processed_total{task_type=\"outbox.noop\",outcome=\"completed\"} 20",
        "outbox_handler_duration_seconds_bucket{task_type=\"outbox.noop\"",
        "outbox_tasks{state=\"claimable\"}",
        "outbox_tasks{state=\"processing\"} 4",
        "outbox_tasks{state=\"dead\"} 0",
        "outbox_oldest_claimable_age_seconds",
        "outbox_oldest_heartbeat_age_seconds",
        "outbox_task_table_dead_tuples",
        "outbox_task_table_live_tuples",
        "outbox_oldest_snapshot_age_seconds",
        "# HELP outbox_tasks_processed_total",
    ];
    let body = scrape_until(port, &wanted, &worker).await;
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    let health = http_get(port, "/health").await.unwrap();
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
        "{health}"
    );
    worker.signal("TERM");
    assert_eq!(
        worker.wait(Duration::from_secs(20)).await.code(),
        Some(0),
        "{}",
        worker.log()
    );
}

/// A periodic task declared on a worker that does not lead, while the
/// leader does not declare it, never runs (only the leader enqueues
/// ticks): the worker says so in its log instead of idling in silence.
#[tokio::test]
async fn a_periodic_task_the_leader_does_not_declare_is_warned_about() {
    let db = TestDb::migrated().await;
    // The leader renews every 5 s a lease of 10 s: a loaded machine does
    // not hand leadership to the follower, which would then declare the
    // task itself.
    let leader = outbox_tests::process::WorkerProcess::spawn(
        BIN,
        &db.url,
        &["--maintenance-interval", "5s"],
    );
    outbox_tests::process::wait_until(
        &db.pool,
        "SELECT EXISTS (SELECT 1 FROM outbox_leases WHERE name = 'maintenance' AND expires_at > now())",
        Duration::from_secs(60),
    )
    .await;
    let mut follower = outbox_tests::process::WorkerProcess::spawn(
        BIN,
        &db.url,
        &[
            "--maintenance-interval",
            "1s",
            "--periodic",
            "tick=every 1s outbox.noop {}",
        ],
    );
    let log = follower
        .wait_for_log(
            "are not declared so by the maintenance leader",
            Duration::from_secs(60),
        )
        .await;
    assert!(log.contains("tick"), "{log}");
    follower.signal("TERM");
    assert_eq!(follower.wait(Duration::from_secs(30)).await.code(), Some(0));
    drop(leader);
}

/// A worker that does not lead, started with a recovery timeout and a
/// worker-row retention of its own, says that the leader's apply (only the
/// leader recovers tasks and forgets workers) instead of accepting them in
/// silence.
#[tokio::test]
async fn maintenance_settings_that_differ_from_the_leaders_are_warned_about() {
    let db = TestDb::migrated().await;
    // The leader renews every 5 s a lease of 10 s: a loaded machine does
    // not hand leadership to the follower.
    let leader = outbox_tests::process::WorkerProcess::spawn(
        BIN,
        &db.url,
        &["--maintenance-interval", "5s"],
    );
    outbox_tests::process::wait_until(
        &db.pool,
        "SELECT EXISTS (SELECT 1 FROM outbox_leases WHERE name = 'maintenance' \
         AND expires_at > now() AND settings IS NOT NULL)",
        Duration::from_secs(60),
    )
    .await;
    let mut follower = outbox_tests::process::WorkerProcess::spawn(
        BIN,
        &db.url,
        &[
            "--maintenance-interval",
            "1s",
            "--heartbeat-timeout",
            "30s",
            "--forget-workers-after",
            "2h",
        ],
    );
    let log = follower
        .wait_for_log(
            "maintenance settings differ from the leader's",
            Duration::from_secs(60),
        )
        .await;
    assert!(
        log.contains("heartbeat_timeout: 30s here, 5m on the leader")
            && log.contains("forget_workers_after: 2h here, 1h on the leader"),
        "{log}"
    );
    assert!(!log.contains("maintenance_interval"), "{log}");
    // The id `workers list` shows is the run id the log starts with.
    let run_id = log
        .split_whitespace()
        .find_map(|field| field.strip_prefix("run_id="))
        .unwrap_or_else(|| panic!("no run_id in the log:\n{log}"));
    let listed = ok(&cli(&["workers", "list", "--database-url", &db.url]).await);
    assert!(
        listed.lines().any(|l| l.starts_with(run_id)),
        "{run_id} not in:\n{listed}"
    );
    follower.signal("TERM");
    assert_eq!(follower.wait(Duration::from_secs(30)).await.code(), Some(0));
    assert!(!leader.log().contains("differ from the leader's"));
    drop(leader);
}

/// `/health` stays 200 while the database is black-holed (a liveness probe
/// must not restart a worker that rides the outage out); `/ready` turns 503
/// within its 2 s deadline and back to 200 when the database returns, and
/// a task submitted during the outage then runs.
#[tokio::test]
async fn ready_follows_the_database_and_health_rides_an_outage_out() {
    let db = TestDb::migrated().await;
    let (proxy, url) = outbox_tests::proxy::FaultProxy::start(&db.url).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut worker = outbox_tests::process::WorkerProcess::spawn(
        BIN,
        &url,
        &["--metrics-addr", &addr, "--shutdown-grace", "1s"],
    );
    let status_of = |path: &'static str| async move {
        http_get(port, path)
            .await
            .and_then(|r| r.split(' ').nth(1).map(str::to_owned))
    };
    let wait_for = |path: &'static str, status: &'static str| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while status_of(path).await.as_deref() != Some(status) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path} never answered {status}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    wait_for("/ready", "200").await;
    proxy.blackhole();
    wait_for("/ready", "503").await;
    assert_eq!(status_of("/health").await.as_deref(), Some("200"));
    let id = outbox::submit(&mut *db.conn().await, outbox_worker::builtin::Noop {})
        .await
        .unwrap();
    proxy.pass();
    wait_for("/ready", "200").await;
    outbox_tests::process::wait_until(
        &db.pool,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM outbox_all_tasks WHERE id = {} AND state = 'completed')",
            id.0
        ),
        Duration::from_secs(60),
    )
    .await;
    worker.signal("TERM");
    assert_eq!(
        worker.wait(Duration::from_secs(30)).await.code(),
        Some(0),
        "{}",
        worker.log()
    );
}

/// Runs `bench --json` with `args` on `db` and returns its report.
async fn bench_json(db: &TestDb, args: &[&str]) -> Value {
    let out = tokio::process::Command::new(BIN)
        .arg("bench")
        .args(args)
        .arg("--json")
        .env("DATABASE_URL", &db.url)
        .env("OUTBOX_LOG", "warn")
        .output()
        .await
        .unwrap();
    serde_json::from_str(&ok(&out)).unwrap()
}

/// Asserts that each of `fields` of `figures` (a part of `report`) is a
/// number above zero.
#[track_caller]
fn assert_positive(report: &Value, figures: &Value, fields: &[&str]) {
    for field in fields {
        assert!(
            figures[field].as_f64().is_some_and(|v| v > 0.0),
            "{field}: {report}"
        );
    }
}

#[tokio::test]
async fn bench_relay_smoke_run_prints_every_figure() {
    // A smoke run of `bench --relay` into its in-process webhook receiver
    // (no broker needed): every phase runs and reports; no speed is
    // asserted. Test builds have every sink: the tests crate, a
    // dev-dependency, turns them on.
    let db = TestDb::empty().await;
    let report = bench_json(
        &db,
        &[
            "--relay",
            "webhook",
            "--business-txs",
            "60",
            "--relay-events",
            "200",
            "--relay-seconds",
            "1",
            "--relay-drop-events",
            "1000",
            "--relay-held-seconds",
            "1",
            "--relay-delayed-events",
            "200",
            "--relay-parked-events",
            "300",
            // Recording as `run --metrics-addr` does, which the relay's
            // instruments are looked up from when it starts.
            "--metrics",
        ],
    )
    .await;
    let relay = &report["relay"];
    assert_positive(
        &report,
        relay,
        &[
            "events_per_s",
            "ordered_1000_keys_events_per_s",
            "two_subscriptions_time_ratio",
            "delayed_events_per_s",
            "drop_ms",
        ],
    );
    assert_eq!(relay["parked_events"], 300, "{report}");
    assert_positive(
        &report,
        &relay["snapshot_held"],
        &[
            "emit_ratio",
            "drain_ratio",
            "last_drain_ratio",
            "held_seconds",
        ],
    );
    assert_positive(&report, &relay["commit_to_ack_ms"], &["p50"]);
    // CPU per event of each drain, from /proc: the relay's is a figure (200
    // events may take less than a clock tick: zero is one); the in-process
    // receiver has no process of its own.
    for drain in [
        "each_event_its_own_aggregate",
        "ordered_1000_keys",
        "two_subscriptions",
    ] {
        let cpu = &relay["drain_cpu_per_event"][drain];
        assert!(
            cpu["relay_us"].as_f64().is_some_and(|v| v >= 0.0),
            "{drain}: {report}"
        );
        assert!(cpu["broker_us"].is_null(), "{drain}: {report}");
        // The whole machine's: a figure, and a share of its cores.
        assert!(
            cpu["machine_us"].as_f64().is_some_and(|v| v >= 0.0),
            "{drain}: {report}"
        );
        assert!(
            cpu["machine_busy"]
                .as_f64()
                .is_some_and(|v| (0.0..=1.0).contains(&v)),
            "{drain}: {report}"
        );
    }
    for field in [
        "two_subscriptions_cpu_floor",
        "two_subscriptions_cpu_floor_without_relay",
    ] {
        assert!(relay[field].as_f64().is_some(), "{field}: {report}");
    }
    for field in [
        "emit_vs_event_row_marginal",
        "emit_vs_event_row_rate",
        "realistic_p50_overhead_pct",
        "realistic_event_row_p50_overhead_pct",
        "realistic_one_client_p50_overhead_pct",
        "realistic_one_client_event_row_p50_overhead_pct",
    ] {
        assert!(relay["emit"][field].as_f64().is_some(), "{field}: {report}");
    }
    // Nothing in the log is ever updated or deleted row by row.
    assert_eq!(relay["log_dead_tuples"].as_i64(), Some(0), "{report}");
}

#[tokio::test]
async fn bench_smoke_run_prints_every_figure() {
    // A smoke run only: figures from a tiny run on a shared machine mean
    // nothing, so nothing here asserts a speed.
    let db = TestDb::empty().await;
    let report = bench_json(
        &db,
        &[
            "--tasks",
            "300",
            "--insert-batch",
            "100",
            "--single-submits",
            "40",
            "--latency-samples",
            "5",
            "--history-completed",
            "200",
            "--history-dead",
            "20",
            "--business-txs",
            "60",
            "--retention-rows",
            "500",
            "--held-snapshot-tasks",
            "200",
            "--held-snapshot-seconds",
            "1",
            "--workflow-steps",
            "100",
            "--fan-in",
            "50",
            "--peer-command",
            r#"echo '{"drain_jobs_per_s": 100}'"#,
            "--peer-command",
            r#"echo "{\"drain_jobs_per_s\": {tasks}, \"c\": {concurrency}}""#,
        ],
    )
    .await;
    assert_positive(
        &report,
        &report,
        &[
            "insert_tasks_per_s",
            "single_submit_tx_per_s",
            "single_submit_autocommit_per_s",
            "single_submit_floor_per_s",
            "drain_tasks_per_s",
            "drain_delete_mode_tasks_per_s",
            "round_trips_per_task",
            "peak_rss_mb",
            "drain_with_history_tasks_per_s",
            "history_ratio",
            "ratio_vs_best_peer",
        ],
    );
    // The drains beside a held snapshot finished, and the snapshot was
    // open all along: a second at least, over as many drains as that took.
    let held = &report["held_snapshot"];
    assert_positive(
        &report,
        held,
        &[
            "tasks_per_s",
            "with_snapshot_held_tasks_per_s",
            "ratio",
            "snapshot_held_seconds",
            "rounds",
            "free_rounds",
            "last_round_ratio",
        ],
    );
    assert!(
        held["snapshot_held_seconds"].as_f64() >= Some(1.0),
        "{report}"
    );
    let business = &report["business_transaction"];
    assert_positive(
        &report,
        business,
        &[
            "plain_tx_per_s",
            "with_submit_tx_per_s",
            "with_second_row_tx_per_s",
            "throughput_ratio",
            "submit_vs_second_row",
        ],
    );
    assert!(business["p99_overhead_pct"].is_number(), "{report}");
    let ordering = &report["ordering"];
    assert_positive(
        &report,
        ordering,
        &["drain_tasks_per_s", "hot_key_tasks_per_s", "hot_key_run_on"],
    );
    let workflows = &report["workflows"];
    assert_eq!(workflows["steps"], 100, "{report}");
    assert_eq!(workflows["fan_in_parts"], 50, "{report}");
    assert_positive(
        &report,
        workflows,
        &[
            "submit_steps_per_s",
            "drain_steps_per_s",
            "plain_tasks_per_s",
            "cost_vs_plain",
            "cost_vs_main_drain",
            "fan_in_drain_s",
        ],
    );
    assert!(
        workflows["fan_in_chord_after_last_part_s"].is_number(),
        "{report}"
    );
    // Both peers ran with this run's figures; the faster one is the yardstick.
    assert_eq!(
        report["peers"].as_array().map(Vec::len),
        Some(2),
        "{report}"
    );
    assert_eq!(report["peers"][1]["c"], 24, "{report}");
    assert_eq!(report["best_peer_drain_jobs_per_s"], 300.0, "{report}");
    assert_eq!(report["pickup_latency_ms"]["samples"], 5);
    // Retention of an expired day: partitions dropped, no row deleted.
    let retention = &report["retention"];
    assert_eq!(retention["rows"], 500, "{report}");
    assert_eq!(retention["rows_deleted"], 0, "{report}");
    assert!(
        retention["partitions_dropped"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{report}"
    );
    assert!(retention["seconds"].as_f64().is_some(), "{report}");
    assert_eq!(db.task_count().await, 0, "the bench cleans up after itself");
}

#[tokio::test]
async fn dashboard_refuses_to_start_without_credentials_or_open_to_the_network() {
    let db = TestDb::migrated().await;
    let url = db.url.as_str();
    refused(
        &["dashboard", "--database-url", url, "--addr", "127.0.0.1:0"],
        2,
        "OUTBOX_DASHBOARD_TOKEN",
    )
    .await;
    refused(
        &[
            "dashboard",
            "--database-url",
            url,
            "--addr",
            "0.0.0.0:0",
            "--insecure-no-auth",
        ],
        2,
        "only allowed on a loopback address",
    )
    .await;
    refused(
        &[
            "dashboard",
            "--database-url",
            url,
            "--insecure-no-auth",
            "--base-path",
            "//evil.example",
        ],
        2,
        "is not a path prefix",
    )
    .await;
    refused(
        &[
            "dashboard",
            "--database-url",
            url,
            "--addr",
            "localhost:99999",
        ],
        2,
        "--addr",
    )
    .await;
    let short = tokio::process::Command::new(BIN)
        .args(["dashboard", "--database-url", url, "--addr", "127.0.0.1:0"])
        .env("OUTBOX_DASHBOARD_TOKEN", "short")
        .output()
        .await
        .unwrap();
    assert_eq!(short.status.code(), Some(2));
    assert!(
        stderr(&short).contains("at least 16 characters"),
        "{}",
        stderr(&short)
    );
}

#[tokio::test]
async fn dashboard_serves_pages_with_a_token_and_stops_on_sigterm() {
    let db = TestDb::migrated().await;
    outbox::submit(&mut *db.conn().await, outbox_worker::builtin::Noop {})
        .await
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(BIN)
        .args(["dashboard", "--database-url", &db.url, "--addr", &addr])
        .env("OUTBOX_DASHBOARD_TOKEN", "a-token-of-twenty-chars")
        .env("OUTBOX_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let anonymous = loop {
        if let Some(reply) = http_get(port, "/").await {
            break reply;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dashboard never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(anonymous.starts_with("HTTP/1.1 303"), "{anonymous}");
    assert!(anonymous.contains("location: /login"), "{anonymous}");
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(
            b"GET / HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer a-token-of-twenty-chars\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).await.unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("data-queue=\"default\""), "{page}");
    let pid = child.id().unwrap();
    outbox_worker::local_broker::send_signal(i64::from(pid), "TERM").unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the dashboard stops on SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn submit_with_a_unique_key_prints_the_holder_and_says_duplicate() {
    let db = TestDb::migrated().await;
    let url = db.url.as_str();
    let submit = |extra: &'static [&'static str]| {
        let mut args = vec![
            "tasks",
            "submit",
            "--database-url",
            url,
            "outbox.noop",
            "{}",
        ];
        args.extend_from_slice(extra);
        args
    };
    let first = ok(&cli(&submit(&["--unique-key", "nightly"])).await);
    let id: i64 = first
        .trim()
        .parse()
        .expect("a fresh submit prints just the id");
    let again = ok(&cli(&submit(&["--unique-key", "nightly"])).await);
    assert_eq!(again.trim(), format!("{id} duplicate"));
    let printed: Value = json(&submit(&["--unique-key", "nightly", "--json"])).await;
    assert_eq!(printed, serde_json::json!({"id": id, "duplicate": true}));
    let other: Value = json(&submit(&["--unique-key", "weekly", "--json"])).await;
    assert_eq!(other["duplicate"], false);
    assert_ne!(other["id"], id);
    let hourly = ok(&cli(&submit(&["--unique-key", "h", "--unique-period", "1h"])).await);
    assert!(!hourly.contains("duplicate"));
    refused(&submit(&["--unique-period", "1h"]), 2, "--unique-key").await;
    refused(
        &submit(&["--unique-key", "x", "--unique-period", "10ms"]),
        2,
        "--unique-period",
    )
    .await;
    refused(
        &submit(&["--unique-key", "x", "--unique-including", "running"]),
        2,
        "[possible values: completed, dead]",
    )
    .await;
    refused(
        &submit(&["--unique-including", "completed"]),
        2,
        "--unique-key",
    )
    .await;
    assert_eq!(db.task_count().await, 3);
    // A completed task keeps the key of its period only when its
    // uniqueness covers completed tasks.
    let daily = |including: &'static [&'static str]| {
        let mut args = submit(&["--unique-key", "d", "--unique-period", "1d"]);
        args.extend_from_slice(including);
        args
    };
    let complete = |id: String| {
        let pool = db.pool.clone();
        async move {
            sqlx::query(
                "UPDATE outbox_tasks SET state = 'completed', finished_at = now() WHERE id = $1",
            )
            .bind(id.trim().parse::<i64>().unwrap())
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let live_only = ok(&cli(&daily(&[])).await);
    complete(live_only).await;
    let covering = ok(&cli(&daily(&["--unique-including", "completed,dead"])).await);
    assert!(!covering.contains("duplicate"), "{covering}");
    complete(covering.clone()).await;
    let again = ok(&cli(&daily(&[])).await);
    assert_eq!(again.trim(), format!("{} duplicate", covering.trim()));
    let shown = ok(&cli(&["tasks", "show", "--database-url", url, &id.to_string()]).await);
    assert!(
        shown.contains("unique key    outbox.noop:nightly"),
        "{shown}"
    );
}

#[tokio::test]
async fn periodic_declarations_are_checked_and_listed() {
    let db = TestDb::migrated().await;
    let url = db.url.as_str();
    for (spec, needle) in [
        ("nightly", "no NAME="),
        ("nightly=0 3 * * * outbox.noop", "JSON"),
        ("nightly=0 3 * * * no.such.type {}", "unknown task type"),
        ("nightly=0 99 * * * outbox.noop {}", "not a valid cron"),
        (
            "nightly=every 1s outbox.sleep {\"ms\": \"x\"}",
            "outbox.sleep",
        ),
    ] {
        refused(
            &["run", "--database-url", url, "--periodic", spec],
            2,
            needle,
        )
        .await;
    }
    refused(
        &[
            "run",
            "--database-url",
            url,
            "--periodic",
            "n=every 30s outbox.noop {}",
            "--periodic",
            "n=every 1m outbox.noop {}",
        ],
        2,
        "two periodic tasks are named \"n\"",
    )
    .await;
    // From the environment, one per line: both read.
    let from_env = tokio::process::Command::new(BIN)
        .args(["run", "--database-url", url])
        .env_remove("DATABASE_URL")
        .env("OUTBOX_LOG", "warn")
        .env(
            "OUTBOX_PERIODIC",
            "n=every 30s outbox.noop {}\nn=0 3 * * * outbox.noop {\"a\": 1}",
        )
        .output()
        .await
        .unwrap();
    assert_eq!(from_env.status.code(), Some(2), "{}", stderr(&from_env));
    assert!(
        stderr(&from_env).contains("two periodic tasks are named \"n\""),
        "{}",
        stderr(&from_env)
    );
    let empty = ok(&cli(&["periodic", "list", "--database-url", url]).await);
    assert!(empty.contains("(none"), "{empty}");
    let mut worker = outbox_tests::process::WorkerProcess::spawn(
        BIN,
        &db.url,
        &[
            // Rounds of 10 s: ticks are enqueued 40 s ahead (lease and
            // two rounds), for the delete below to take back.
            "--maintenance-interval",
            "10s",
            "--periodic",
            "sweep=every 1s outbox.noop {}",
        ],
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let listed = json(&["periodic", "list", "--database-url", url, "--json"]).await;
        if listed[0]["last_run"].is_string() {
            break listed;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", worker.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(listed[0]["name"], "sweep");
    assert_eq!(listed[0]["schedule"], "every 1s");
    assert_eq!(listed[0]["task_type"], "outbox.noop");
    let table = ok(&cli(&["periodic", "list", "--database-url", url]).await);
    assert!(
        table.contains("sweep") && table.contains("every 1s"),
        "{table}"
    );
    // Ticks are enqueued ahead: the column says so rather than "last run".
    assert!(
        table.contains("COVERED UP TO") && table.contains("DECLARED"),
        "{table}"
    );
    // The leader declares it: deleting it would only pause it until the
    // next leader, so it is refused; so is a name with no record.
    refused(
        &["periodic", "delete", "sweep", "--database-url", url],
        2,
        "the current maintenance leader declares sweep",
    )
    .await;
    refused(
        &["periodic", "delete", "sweeep", "--database-url", url],
        1,
        "no periodic task named \"sweeep\" (recorded: sweep)",
    )
    .await;
    worker.signal("TERM");
    worker.wait(Duration::from_secs(20)).await;
    // The leader hands its lease over as it stops, or it runs out (20 s).
    outbox_tests::process::wait_until(
        &db.pool,
        "SELECT bool_and(expires_at <= now()) FROM outbox_leases WHERE name = 'maintenance'",
        Duration::from_secs(60),
    )
    .await;
    // With no leader enqueuing it, its next tick falls behind, and the
    // list says why (the time moved back here, as minutes passing would).
    let listed = ok(&cli(&["periodic", "list", "--database-url", url]).await);
    assert!(!listed.contains("overdue"), "{listed}");
    sqlx::query("UPDATE outbox_periodic SET next_tick = now() - interval '10 minutes'")
        .execute(&db.pool)
        .await
        .unwrap();
    let listed = ok(&cli(&["periodic", "list", "--database-url", url]).await);
    assert!(
        listed.contains("overdue: sweep: no running maintenance leader enqueues them"),
        "{listed}"
    );
    // Removed from the code (no worker declares it now): its record and
    // the ticks it enqueued ahead go; a tick's task of another name stays.
    sqlx::query(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts, execute_at, unique_key, unique_states) \
         VALUES ('outbox.noop', 'default', '{}', 3, now() + interval '1 hour', 'periodic:sweep:x:1', 31)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let ahead = "SELECT count(*) FROM outbox_tasks WHERE unique_key LIKE 'periodic:sweep:%' \
                 AND state = 'pending' AND execute_at > now()";
    let before: i64 = sqlx::query_scalar(ahead).fetch_one(&db.pool).await.unwrap();
    assert!(before > 10, "{before}: the leader enqueued ticks ahead");
    let out = ok(&cli(&["periodic", "delete", "sweep", "--database-url", url]).await);
    let taken: i64 = out
        .trim()
        .strip_prefix("deleted periodic task sweep and ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    // Those still ahead when it ran (seconds pass between the two looks).
    assert!(taken >= 10 && taken < before, "{out}: {before} were ahead");
    let after: i64 = sqlx::query_scalar(ahead).fetch_one(&db.pool).await.unwrap();
    assert_eq!(after, 1, "only the other name's task is left");
    assert!(ok(&cli(&["periodic", "list", "--database-url", url]).await).contains("(none"));
}

/// A position sequence the relays refuse to read behind (a cache) does not
/// stop `events emit`: the event is written, and the command warns that
/// relays will not publish it as things stand.
#[tokio::test]
async fn an_emit_while_relays_read_nothing_is_written_with_a_warning() {
    let db = TestDb::migrated().await;
    sqlx::query("ALTER SEQUENCE outbox_event_position_seq CACHE 20")
        .execute(&db.pool)
        .await
        .unwrap();
    let out = cli(&[
        "events",
        "emit",
        "order",
        "7",
        "order.placed",
        "{}",
        "--database-url",
        db.url.as_str(),
    ])
    .await;
    assert!(ok(&out).starts_with("emitted event "));
    assert!(
        stderr(&out).contains("warning: relays read nothing") && stderr(&out).contains("CACHE 1"),
        "{}",
        stderr(&out)
    );
    let logged: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_event_log")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(logged, 1);
    // With no subscription yet, the listing says the first relay would
    // read nothing, and fails.
    let listed = cli(&["events", "subscriptions", "--database-url", &db.url]).await;
    assert_eq!(listed.status.code(), Some(1), "{}", stderr(&listed));
    assert!(
        stderr(&listed).contains("relays would read nothing")
            && stderr(&listed).contains("CACHE 1"),
        "{}",
        stderr(&listed)
    );
}

#[tokio::test]
async fn events_are_emitted_listed_and_handled_from_the_command_line_and_bad_relays_refused() {
    let db = TestDb::migrated().await;
    let at = ["--database-url", db.url.as_str()];
    let with_db = |args: &[&'static str]| {
        let mut v = args.to_vec();
        v.extend(at);
        v
    };
    assert!(ok(&cli(&with_db(&["events", "subscriptions"])).await).contains("no subscriptions"));
    let emitted = ok(&cli(&with_db(&[
        "events",
        "emit",
        "order",
        "42",
        "order.placed",
        r#"{"total": 990}"#,
        "--header",
        "tenant=acme",
    ]))
    .await);
    assert!(emitted.starts_with("emitted event "), "{emitted}");
    // The log row is Debezium's outbox layout.
    let logged: (String, String, serde_json::Value) =
        sqlx::query_as("SELECT id::text, aggregateid, headers FROM outbox_event_log")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(emitted.contains(&logged.0), "{emitted} vs {logged:?}");
    assert_eq!(logged.1, "42");
    assert_eq!(logged.2, serde_json::json!({"tenant": "acme"}));
    assert_eq!(
        json(&with_db(&["events", "backlog", "--json"])).await,
        serde_json::json!([])
    );
    assert!(ok(&cli(&with_db(&["events", "parked"])).await).contains("no events held back"));
    for command in [
        &["events", "parked", "--subscription", "nobody"][..],
        &["events", "retry", "nobody", "order", "42"],
        &["events", "retry", "nobody", "--all"],
        &[
            "events",
            "skip",
            "nobody",
            "order",
            "42",
            "--event",
            "0190a0b0-0000-7000-8000-000000000001",
        ],
        &["events", "rewind", "nobody", "--to", "head"],
    ] {
        refused(&with_db(command), 1, "there is no subscription \"nobody\"").await;
    }
    refused(
        &with_db(&["events", "rewind", "nobody", "--to", "0"]),
        2,
        "a position (1 or more)",
    )
    .await;
    refused(
        &with_db(&["events", "skip", "nobody", "order", "42", "--event", "0190"]),
        2,
        "is not an event id",
    )
    .await;
    // One aggregate, or --all: not both, not neither.
    for (command, says) in [
        (&["events", "retry", "nobody"][..], "required"),
        (
            &["events", "retry", "nobody", "order", "42", "--all"],
            "cannot be used with",
        ),
        (
            &["events", "retry", "nobody", "--type", "order"],
            "required",
        ),
        (
            &["events", "retry", "nobody", "--all", "--now"],
            "cannot be used with",
        ),
        // The event a destructive or early action acts on is named.
        (&["events", "skip", "nobody", "order", "42"], "--event"),
        (
            &["events", "retry", "nobody", "order", "42", "--now"],
            "--event",
        ),
        (
            &[
                "events",
                "retry",
                "nobody",
                "order",
                "42",
                "--event",
                "0190a0b0-0000-7000-8000-000000000001",
            ],
            "--now",
        ),
    ] {
        refused(&with_db(command), 2, says).await;
    }
    refused(
        &with_db(&["events", "emit", "order", "1", "t", "{}", "--delay", "366d"]),
        2,
        "out of range",
    )
    .await;
    // The payload from a file, as `tasks submit` reads one; a delay.
    let file = std::env::temp_dir().join(format!("outbox-cli-event-{}.json", std::process::id()));
    std::fs::write(&file, r#"{"from": "file"}"#).unwrap();
    let from_file = format!("@{}", file.display());
    let args = [
        "events",
        "emit",
        "order",
        "43",
        "order.placed",
        &from_file,
        "--delay",
        "1h",
    ];
    let mut args = args.to_vec();
    args.extend(at);
    ok(&cli(&args).await);
    std::fs::remove_file(&file).unwrap();
    let (payload, delayed): (serde_json::Value, bool) = sqlx::query_as(
        "SELECT payload, publish_at > now() + interval '50 minutes' FROM outbox_event_log \
         WHERE aggregateid = '43'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(payload, serde_json::json!({"from": "file"}));
    assert!(delayed);
    // A stream no subscription reads: written, with a warning, until one
    // does.
    let audit = with_db(&[
        "events", "emit", "order", "44", "t", "{}", "--queue", "audit",
    ]);
    let unread = cli(&audit).await;
    assert!(unread.status.success(), "{}", stderr(&unread));
    assert!(
        stderr(&unread).contains("no subscription reads stream \"audit\" yet"),
        "{}",
        stderr(&unread)
    );
    sqlx::query(
        "INSERT INTO outbox_event_subscriptions (name, stream, partitions) \
         VALUES ('auditor', 'audit', 1)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let read = cli(&audit).await;
    assert!(read.status.success(), "{}", stderr(&read));
    assert!(
        !stderr(&read).contains("no subscription reads"),
        "{}",
        stderr(&read)
    );
    // A relay of that name reading another stream would publish what its
    // sink was not set up for: refused at start.
    refused(
        &with_db(&["run", "--relay", "auditor=nats://127.0.0.1:1"]),
        2,
        "relay \"auditor\" reads stream \"events\", but its subscription reads \"audit\"",
    )
    .await;
    sqlx::query("DELETE FROM outbox_event_subscriptions WHERE name = 'auditor'")
        .execute(&db.pool)
        .await
        .unwrap();

    refused(
        &with_db(&["events", "emit", "order", "1", "t", "{nope"]),
        2,
        "the payload is not valid JSON",
    )
    .await;
    refused(
        &with_db(&[
            "events", "emit", "order", "1", "t", "{}", "--header", "a=1", "--header", "a=2",
        ]),
        2,
        "header \"a\" is given twice",
    )
    .await;
    // A number the command line would round is refused, not rounded.
    refused(
        &with_db(&[
            "events",
            "emit",
            "order",
            "1",
            "t",
            r#"{"big": 12345678901234567890123}"#,
        ]),
        2,
        "would be stored rounded",
    )
    .await;
    refused(
        &with_db(&["events", "emit", "a/b", "1", "t", "{}"]),
        2,
        "contains '/'",
    )
    .await;
    refused(
        &with_db(&[
            "events",
            "emit",
            "order",
            "1",
            "t",
            "{}",
            "--header",
            "sequence=1",
        ]),
        2,
        "set by the relay itself",
    )
    .await;
    refused(
        &with_db(&[
            "events",
            "emit",
            "order",
            "1",
            "t",
            "{}",
            "--header",
            "traceparent=garbage",
        ]),
        2,
        "is not a W3C trace context",
    )
    .await;
    refused(&with_db(&["run", "--relay", "nats"]), 2, "is not NAME=URL").await;
    refused(
        &with_db(&["run", "--relay", "k=ftp://127.0.0.1:1"]),
        2,
        "no sink for URL scheme \"ftp\"",
    )
    .await;
    refused(
        &with_db(&[
            "run",
            "--relay",
            "n=nats://127.0.0.1:1?concurrency=999999999",
        ]),
        2,
        "is out of range",
    )
    .await;
    refused(
        &with_db(&["run", "--relay", "n=nats://127.0.0.1:1?timeout_ms=abc"]),
        2,
        "option timeout_ms=\"abc\" is not a whole number",
    )
    .await;
    refused(
        &with_db(&[
            "run",
            "--relay",
            "a=nats://127.0.0.1:1",
            "--relay",
            "a=redis://127.0.0.1:1",
        ]),
        2,
        "two relays are named \"a\"",
    )
    .await;
    // Refused before either is built: no warning that they are unsigned.
    let out = cli(&with_db(&[
        "run",
        "--relay",
        "w=http://127.0.0.1:1/hook",
        "--relay",
        "w=http://127.0.0.1:1/other",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("two relays are named \"w\"") && !stderr(&out).contains("not signed"),
        "{}",
        stderr(&out)
    );
    refused(
        &with_db(&["run", "--relay", "n=nats://127.0.0.1:1?partitions=0"]),
        2,
        "relay \"n\": option partitions=\"0\" is out of range",
    )
    .await;
    refused(
        &with_db(&[
            "run",
            "--relay",
            "w=http://127.0.0.1:1/hook?route=a.{aggregate_type}",
        ]),
        2,
        "relay \"w\": option route= names a broker's subject",
    )
    .await;
    // A bad name is refused before the sink is built: a webhook's warning
    // that its requests go unsigned would name a variable that cannot be.
    let badly_named = cli(&with_db(&["run", "--relay", "a.b=http://127.0.0.1:1/hook"])).await;
    assert_eq!(
        badly_named.status.code(),
        Some(2),
        "{}",
        stderr(&badly_named)
    );
    assert!(
        stderr(&badly_named).contains("relay name \"a.b\": use 1 to 64")
            && !stderr(&badly_named).contains("SECRET"),
        "{}",
        stderr(&badly_named)
    );
    // A stream made over subjects the route's are not among: its events
    // would find no stream, retried for ever.
    refused(
        &with_db(&[
            "run",
            "--relay",
            "n=nats://127.0.0.1:1?stream=EVENTS&stream_subjects=orders.>",
        ]),
        2,
        "relay \"n\": stream \"EVENTS\" would listen on [\"orders.>\"], which do not take the route \"outbox.event.{aggregate_type}\"",
    )
    .await;
    let logged: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_event_log")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        logged, 4,
        "no refusal wrote anything (two events, and two to \"audit\")"
    );
}

/// Waits (a minute at most) until `events parked` lists `aggregate`.
async fn held_back(url: &str, aggregate: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let rows: Value = serde_json::from_str(&ok(&cli(&[
            "events",
            "parked",
            "--json",
            "--database-url",
            url,
        ])
        .await))
        .unwrap();
        let first = rows.as_array().unwrap().iter().find(|r| {
            format!(
                "{}/{}",
                r["aggregatetype"].as_str().unwrap(),
                r["aggregateid"].as_str().unwrap()
            ) == aggregate
        });
        if let Some(row) = first {
            return row["id"].as_str().unwrap().to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{aggregate} was never held back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_relay_run_from_flags_publishes_and_its_metrics_show_published_and_parked() {
    let db = TestDb::migrated().await;
    // A webhook receiver that refuses the aggregate "bad" for good.
    let receiver = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_port = receiver.local_addr().unwrap().port();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(|headers: axum::http::HeaderMap| async move {
            if headers
                .get("outbox-aggregate-id")
                .is_some_and(|v| v == "bad")
            {
                axum::http::StatusCode::BAD_REQUEST
            } else {
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let server = tokio::spawn(async move { axum::serve(receiver, app).await });
    // "emitted event <id> at position <n>", for each.
    let mut emitted = Vec::new();
    for id in ["1", "2", "bad", "bad", "3"] {
        emitted.push(ok(&cli(&[
            "events",
            "emit",
            "order",
            id,
            "order.placed",
            "{}",
            "--database-url",
            &db.url,
        ])
        .await));
    }
    let word = |line: &str, n: usize| line.split_whitespace().nth(n).unwrap().to_owned();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let relay = format!("hooks=http://127.0.0.1:{hook_port}/hook?give_up_after=1");
    let mut worker = outbox_tests::process::WorkerProcess::spawn(
        BIN,
        &db.url,
        &[
            "--metrics-addr",
            &addr,
            "--relay",
            &relay,
            "--shutdown-grace",
            "1s",
        ],
    );
    let wanted = [
        "outbox_relay_published_total{relay=\"hooks\"} 3",
        "outbox_relay_failures_total{relay=\"hooks\",class=\"permanent\",kind=\"http_refused\"} 1",
        "outbox_relay_commit_to_ack_seconds_bucket{relay=\"hooks\"",
        "outbox_relay_publish_seconds_bucket{relay=\"hooks\"",
        "outbox_relay_backlog{relay=\"hooks\"} 0",
        "outbox_relay_parked_events{relay=\"hooks\"} 2",
        "outbox_relay_parked_aggregates{relay=\"hooks\"} 1",
        "outbox_relay_refused_aggregates{relay=\"hooks\"} 1",
        "outbox_relay_stopped{relay=\"hooks\"} 0",
        "outbox_relay_failing_seconds{relay=\"hooks\"} 0",
        "outbox_relay_parked_total{relay=\"hooks\"} 2",
        "outbox_relay_oldest_unpublished_age_seconds{relay=\"hooks\"}",
        "# HELP outbox_relay_published_total",
    ];
    scrape_until(port, &wanted, &worker).await;
    // No secret: said at start, in case its variable was misspelt.
    assert!(
        worker
            .log()
            .contains("OUTBOX_RELAY_HOOKS_SECRET (whsec_...) to sign them"),
        "{}",
        worker.log()
    );
    let parked = ok(&cli(&["events", "parked", "--database-url", &db.url]).await);
    assert!(parked.contains("order/bad"), "{parked}");
    // One event and where the subscription stands with it: by position,
    // by id, and one the log does not have.
    let show = |event: String| {
        let url = db.url.clone();
        async move { cli(&["events", "show", &event, "--database-url", &url]).await }
    };
    let published = show(word(&emitted[0], 5)).await;
    assert!(
        stdout(&published).contains("hooks: passed\n(passed: published, or passed over"),
        "{}{}",
        stdout(&published),
        stderr(&published)
    );
    let refused = show(word(&emitted[2], 2)).await;
    assert!(
        stdout(&refused).contains("hooks: held back: refused: webhook refused the event"),
        "{}{}",
        stdout(&refused),
        stderr(&refused)
    );
    let json = cli(&[
        "events",
        "show",
        &word(&emitted[3], 5),
        "--json",
        "--database-url",
        &db.url,
    ])
    .await;
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(json["aggregate_id"], "bad");
    assert_eq!(json["subscriptions"][0]["state"], "held back");
    let missing = show("999999".to_owned()).await;
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("the log has no event at position 999999"));
    let missing_id = show("0190a0b0-0000-4000-8000-0000000000ff".to_owned()).await;
    assert_eq!(missing_id.status.code(), Some(1), "{}", stderr(&missing_id));
    assert!(
        stderr(&missing_id).contains("within 1d of its time"),
        "{}",
        stderr(&missing_id)
    );
    assert!(parked.contains("http_refused"), "{parked}");
    // The event behind the refused one waits for it, not for a time.
    assert!(parked.contains("(behind "), "{parked}");
    let subs = ok(&cli(&["events", "subscriptions", "--database-url", &db.url]).await);
    assert!(subs.contains("hooks"), "{subs}");
    // A relay that reads nothing fails the listing, for scripts and health
    // checks, after saying why.
    let cache = |n: u32| format!("ALTER SEQUENCE outbox_event_position_seq CACHE {n}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(cache(20)))
        .execute(&db.pool)
        .await
        .unwrap();
    let stopped = cli(&["events", "subscriptions", "--database-url", &db.url]).await;
    let listing = String::from_utf8_lossy(&stopped.stdout);
    assert_eq!(
        stopped.status.code(),
        Some(1),
        "{listing}{}",
        stderr(&stopped)
    );
    assert!(
        listing.contains("hooks: its relay reads nothing"),
        "{listing}"
    );
    assert!(
        stderr(&stopped).contains("read nothing"),
        "{}",
        stderr(&stopped)
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(cache(1)))
        .execute(&db.pool)
        .await
        .unwrap();
    ok(&cli(&["events", "subscriptions", "--database-url", &db.url]).await);
    // The subscription recorded its kind of sink: a relay of its name that
    // publishes elsewhere (deployed under a taken name) is refused at start
    // instead of taking the subscription's events to another broker.
    assert_eq!(
        outbox::relay::subscription_record(&db.pool, "hooks")
            .await
            .unwrap()
            .and_then(|r| r.sink)
            .as_deref(),
        Some("webhook")
    );
    let elsewhere = cli(&[
        "run",
        "--relay",
        "hooks=redis://127.0.0.1:9?route=elsewhere",
        "--database-url",
        &db.url,
    ])
    .await;
    assert_eq!(elsewhere.status.code(), Some(2), "{}", stderr(&elsewhere));
    assert!(
        stderr(&elsewhere).contains(
            "relay \"hooks\" publishes to redis, but its subscription publishes to webhook"
        ),
        "{}",
        stderr(&elsewhere)
    );
    // A skip that names another event than the first held back drops
    // nothing; a malformed id is refused.
    for (event, says) in [
        ("0190a0b0-0000-7000-8000-000000000001", "skipped nothing"),
        ("nope", "is not an event id"),
    ] {
        let refused = cli(&[
            "events",
            "skip",
            "hooks",
            "order",
            "bad",
            "--event",
            event,
            "--database-url",
            &db.url,
        ])
        .await;
        assert!(!refused.status.success(), "{event}");
        assert!(stderr(&refused).contains(says), "{}", stderr(&refused));
    }
    // Every refused aggregate tried again: refused again, for good.
    let retried = ok(&cli(&[
        "events",
        "retry",
        "hooks",
        "--all",
        "--database-url",
        &db.url,
    ])
    .await);
    assert!(
        retried.contains("hooks tries 1 refused aggregate(s) again now"),
        "{retried}"
    );
    scrape_until(
        port,
        &["outbox_relay_failures_total{relay=\"hooks\",class=\"permanent\",kind=\"http_refused\"} 2"],
        &worker,
    )
    .await;
    let refused_id = held_back(&db.url, "order/bad").await;
    let skipped = ok(&cli(&[
        "events",
        "skip",
        "hooks",
        "order",
        "bad",
        "--event",
        &refused_id,
        "--database-url",
        &db.url,
    ])
    .await);
    assert!(
        skipped.starts_with(&format!("skipped event {refused_id} ")),
        "{skipped}"
    );
    // A retry of an aggregate held back by its event's own delay says the
    // delay stands.
    ok(&cli(&[
        "events",
        "emit",
        "order",
        "later",
        "order.placed",
        "{}",
        "--delay",
        "1h",
        "--database-url",
        &db.url,
    ])
    .await);
    let later = held_back(&db.url, "order/later").await;
    let retried = ok(&cli(&[
        "events",
        "retry",
        "hooks",
        "order",
        "later",
        "--database-url",
        &db.url,
    ])
    .await);
    assert!(retried.contains("is delayed until then"), "{retried}");
    // --now publishes it at once, only while the event it names is first.
    let publish_now = |event: &str| {
        let args = [
            "events",
            "retry",
            "hooks",
            "order",
            "later",
            "--now",
            "--event",
            event,
            "--database-url",
            &db.url,
        ]
        .map(str::to_owned);
        async move { cli(&args.each_ref().map(String::as_str)).await }
    };
    let stale = publish_now("0190a0b0-0000-7000-8000-000000000001").await;
    assert_eq!(stale.status.code(), Some(1), "{}", stderr(&stale));
    assert!(
        stderr(&stale).contains("published nothing early"),
        "{}",
        stderr(&stale)
    );
    let now = ok(&publish_now(&later).await);
    assert!(now.contains("publishes order/later now"), "{now}");
    scrape_until(
        port,
        &["outbox_relay_published_total{relay=\"hooks\"} 4"],
        &worker,
    )
    .await;
    // A delayed event named by its id is dropped, never published.
    let emitted = ok(&cli(&[
        "events",
        "emit",
        "order",
        "later2",
        "order.placed",
        "{}",
        "--delay",
        "1h",
        "--database-url",
        &db.url,
    ])
    .await);
    let id = emitted
        .split_whitespace()
        .nth(2)
        .expect("emitted event <id> at position <n>")
        .to_owned();
    assert_eq!(held_back(&db.url, "order/later2").await, id);
    let dropped = ok(&cli(&[
        "events",
        "skip",
        "hooks",
        "order",
        "later2",
        "--event",
        &id,
        "--database-url",
        &db.url,
    ])
    .await);
    assert_eq!(
        dropped.trim(),
        format!(
            "skipped event {id} of order/later2 for hooks; the rest of its events are published next"
        )
    );
    assert!(
        !ok(&cli(&["events", "parked", "--database-url", &db.url]).await).contains("order/later2")
    );
    // A position past the head is said to be one, and gives the head.
    let past = ok(&cli(&[
        "events",
        "rewind",
        "hooks",
        "--to",
        "999999999",
        "--database-url",
        &db.url,
    ])
    .await);
    assert!(
        past.contains("position 999999999 is past the log's head (")
            && past.contains("the subscription goes to the head"),
        "{past}"
    );
    let rewound = ok(&cli(&[
        "events",
        "rewind",
        "hooks",
        "--to",
        "head",
        "--database-url",
        &db.url,
    ])
    .await);
    assert!(
        rewound.contains("now publishes the events after position"),
        "{rewound}"
    );
    let delete = [
        "events",
        "delete-subscription",
        "hooks",
        "--database-url",
        &db.url,
    ];
    let refused = cli(&delete).await;
    assert!(!refused.status.success(), "deleted while its relay runs");
    assert!(
        stderr(&refused).contains("is running"),
        "{}",
        stderr(&refused)
    );
    worker.signal("TERM");
    assert_eq!(
        worker.wait(Duration::from_secs(20)).await.code(),
        Some(0),
        "{}",
        worker.log()
    );
    server.abort();
    // The rewind above took the partition back while the relay held it:
    // its old lease's time stays until it runs out (the holder may still
    // have been publishing from the old cursor), unless the relay took the
    // partition again since and handed it back as it stopped.
    outbox_tests::process::wait_until(
        &db.pool,
        "SELECT NOT EXISTS (SELECT 1 FROM outbox_event_cursors \
         WHERE subscription = 'hooks' AND lease_until > now())",
        Duration::from_secs(60),
    )
    .await;
    // A relay that stopped says so and hands its leases back: its
    // subscription can go, and says what it held back.
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_event_parked WHERE subscription = 'hooks'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let deleted = ok(&cli(&delete).await);
    let said = match held {
        0 => "deleted subscription \"hooks\": retention".to_owned(),
        n => format!("deleted subscription \"hooks\" and the {n} event(s) it held back"),
    };
    assert!(deleted.starts_with(&said), "{deleted}");
    let subs = ok(&cli(&["events", "subscriptions", "--database-url", &db.url]).await);
    assert!(subs.starts_with("no subscriptions"), "{subs}");
    let again = cli(&delete).await;
    assert!(
        stderr(&again).contains("there is no subscription"),
        "{}",
        stderr(&again)
    );
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(line) = std::fs::read(entry.path().join("cmdline")) {
            let line = String::from_utf8_lossy(&line).replace('\0', " ");
            if line.contains(needle) {
                found.push(line);
            }
        }
    }
    found
}

#[tokio::test]
async fn an_interrupted_bench_stops_the_postgres_it_started() {
    // No database given: the bench starts a private one, under a directory
    // named after its process id.
    let child = tokio::process::Command::new(BIN)
        .args(["bench", "--tasks", "2000000", "--business-txs", "0"])
        .env_remove("DATABASE_URL")
        .env("OUTBOX_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let marker = format!("outbox-pg-{pid}-");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !processes_mentioning(&marker)
        .iter()
        .any(|p| p.contains("bin/postgres"))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the bench's PostgreSQL never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // As the terminal's Ctrl-C would: the server has its own process group,
    // so only the bench gets the signal.
    outbox_worker::local_broker::send_signal(i64::from(pid), "INT").unwrap();
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the bench stops on SIGINT")
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("interrupted"), "{}", stderr(&out));
    let left = processes_mentioning(&marker);
    assert!(left.is_empty(), "still running: {left:?}");
    let dirs: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with(&marker))
        .collect();
    assert!(dirs.is_empty(), "left behind: {dirs:?}");
}

/// Runs a shell command printed by the binary when dropped (a kept
/// PostgreSQL's stop command), so that a failed test leaves no server.
struct RunOnDrop(Option<String>);

impl Drop for RunOnDrop {
    fn drop(&mut self) {
        if let Some(command) = self.0.take() {
            let _ = std::process::Command::new("sh")
                .args(["-c", &command])
                .output();
        }
    }
}

#[tokio::test]
async fn demo_keep_leaves_its_postgres_for_the_commands_it_suggests() {
    let out = tokio::process::Command::new(BIN)
        .args(["demo", "--tasks", "20", "--no-progress", "--keep"])
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap();
    let printed = ok(&out);
    let mut lines = printed.lines();
    let stop = lines
        .find(|l| l.contains("stop it and remove its files with:"))
        .and_then(|_| lines.next())
        .expect("the stop command")
        .trim()
        .to_owned();
    let mut stop = RunOnDrop(Some(stop));
    let suggested = printed
        .lines()
        .find(|l| l.contains("tasks list --dead --database-url "))
        .expect("the suggested command");
    let url = suggested
        .split("--database-url ")
        .nth(1)
        .unwrap()
        .trim()
        .to_owned();
    assert!(url.starts_with("postgres://"), "{printed}");
    // The demo's three poison tasks, from the server it left running.
    let dead: Value = serde_json::from_str(&ok(&cli(&[
        "tasks",
        "list",
        "--dead",
        "--json",
        "--database-url",
        &url,
    ])
    .await))
    .unwrap();
    assert_eq!(dead.as_array().map(Vec::len), Some(3), "{dead}");
    // Its stop command stops it.
    let command = stop.0.take().unwrap();
    let stopped = std::process::Command::new("sh")
        .args(["-c", &command])
        .output()
        .unwrap();
    assert!(stopped.status.success(), "{command}: {stopped:?}");
    let out = cli(&["stats", "--database-url", &url]).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

/// `events emit --id` again: the same event (its payload's keys in
/// another order) writes nothing, as a retry should; a different event
/// under that id is refused, not dropped without a word.
#[tokio::test]
async fn an_event_id_given_again_for_another_event_is_refused() {
    let db = TestDb::migrated().await;
    let id = "0190a0b0-0000-7000-8000-0000000000aa";
    let emit = |aggregate: &'static str, payload: &'static str| {
        vec![
            "events",
            "emit",
            "order",
            aggregate,
            "order.placed",
            payload,
            "--id",
            id,
            "--database-url",
            db.url.as_str(),
        ]
    };
    let first = ok(&cli(&emit("7", r#"{"a": 1, "b": 2}"#)).await);
    assert!(first.starts_with(&format!("emitted event {id}")), "{first}");
    let again = ok(&cli(&emit("7", r#"{"b": 2, "a": 1}"#)).await);
    assert!(
        again.contains("was emitted before: nothing written"),
        "{again}"
    );
    for (aggregate, payload) in [("7", r#"{"a": 1, "b": 3}"#), ("8", r#"{"a": 1, "b": 2}"#)] {
        refused(
            &emit(aggregate, payload),
            2,
            "was emitted before for a different event",
        )
        .await;
    }
    let logged: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_event_log")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(logged, 1);
    // Found by its id, though the time its v7 form carries is made up;
    // no subscription reads it yet.
    let shown = ok(&cli(&["events", "show", id, "--database-url", db.url.as_str()]).await);
    assert!(
        shown.starts_with(&format!("event {id} at position 1: order/7")),
        "{shown}"
    );
    assert!(
        shown.contains("no subscription reads stream \"events\""),
        "{shown}"
    );
    for (event, says) in [
        ("0", "a position is 1 or more"),
        (
            "nope",
            "\"nope\" is neither a position (1 or more) nor an event id",
        ),
    ] {
        refused(
            &["events", "show", event, "--database-url", db.url.as_str()],
            2,
            says,
        )
        .await;
    }
    // An id recorded before migration 38 has no digest: not compared.
    sqlx::query("UPDATE outbox_event_ids SET digest = NULL")
        .execute(&db.pool)
        .await
        .unwrap();
    let old = ok(&cli(&emit("8", "{}")).await);
    assert!(old.contains("was emitted before: nothing written"), "{old}");
}
