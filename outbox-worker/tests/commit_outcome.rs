//! `events emit` and `tasks submit` while their sessions are terminated
//! again and again (as a failover or `pg_terminate_backend` does): a
//! command that exits non-zero either wrote nothing or says that its
//! outcome is unknown, naming the id, and the retry it names writes the
//! event or task exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use outbox_tests::TestDb;

mod common;

use common::{cli, stderr, stdout};

/// Commands run at least; more while no emit has exited 0 or no command
/// was hit, up to `MAX_TRIES`.
const TRIES: usize = 60;
const MAX_TRIES: usize = 400;
const APP: &str = "commit-outcome-test";

/// The shortest and longest pause of the terminator, in milliseconds.
const FASTEST_MS: u64 = 3;
const SLOWEST_MS: u64 = 250;

/// Terminates the test's command sessions every few milliseconds until
/// `stop`; returns how many it terminated. The pause is `pace` plus 0 to
/// 14 ms, varied so terminations land in every phase of a command:
/// connect, insert, COMMIT, the outcome query.
fn terminator(
    pool: sqlx::PgPool,
    stop: Arc<AtomicBool>,
    pace: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<i64> {
    tokio::spawn(async move {
        let mut terminated = 0;
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            round += 1;
            let n: Option<i64> = sqlx::query_scalar(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = $1",
            )
            .bind(APP)
            .fetch_one(&pool)
            .await
            .ok();
            terminated += n.unwrap_or(0);
            let ms = pace.load(Ordering::Relaxed) + (round * 7) % 15;
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        terminated
    })
}

/// How many rows name `id`: events by id, tasks by unique key.
async fn count(db: &TestDb, event: bool, id: &str) -> i64 {
    let sql = if event {
        "SELECT count(*) FROM outbox_event_log WHERE id = $1::uuid"
    } else {
        // Unique keys are stored behind their task type.
        "SELECT count(*) FROM outbox_all_tasks WHERE unique_key = 'outbox.noop:' || $1"
    };
    sqlx::query_scalar(sql)
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

fn command(url: &str, event: bool, id: &str) -> Vec<String> {
    let args: &[&str] = if event {
        &[
            "events",
            "emit",
            "order",
            "7",
            "order.placed",
            "{}",
            "--id",
            id,
        ]
    } else {
        &["tasks", "submit", "outbox.noop", "{}", "--unique-key", id]
    };
    let mut v: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    v.extend(["--database-url".to_owned(), url.to_owned()]);
    v
}

async fn run(args: &[String]) -> std::process::Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cli(&args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_session_dies_is_absent_or_named_and_its_retry_writes_it_once() {
    let db = TestDb::migrated().await;
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}application_name={APP}", db.url);
    let stop = Arc::new(AtomicBool::new(false));
    // A command that exits 0 must connect, load its caches, plan, write
    // and commit between two terminations, which a loaded machine may not
    // manage at a few milliseconds: each command that fails lengthens the
    // pause (up to 250 ms) and each that succeeds halves it, so commands
    // are hit at about the fastest pace at which some still get through.
    let pace = Arc::new(AtomicU64::new(FASTEST_MS));
    let killer = terminator(db.pool.clone(), stop.clone(), pace.clone());
    let paced = |failed: bool| {
        let now = pace.load(Ordering::Relaxed);
        // Up by half, down by half: the pace settles where more commands
        // are hit than get through.
        let next = if failed { now + now / 2 + 1 } else { now / 2 };
        pace.store(next.clamp(FASTEST_MS, SLOWEST_MS), Ordering::Relaxed);
    };

    let mut written: Vec<(bool, String)> = Vec::new();
    let mut in_doubt = Vec::new();
    let mut absent = 0;
    let mut resolved = 0;
    let mut i = 0;
    while i < TRIES
        || !written.iter().any(|(event, _)| *event)
        || absent + in_doubt.len() + resolved == 0
    {
        assert!(
            i < MAX_TRIES,
            "after {i} commands: {} written ({resolved} after asking the server), {absent} \
             refused, {} in doubt",
            written.len(),
            in_doubt.len()
        );
        let event = i % 2 == 0;
        i += 1;
        let id = if event {
            outbox::events::new_event_id()
        } else {
            format!("commit-outcome-{i}")
        };
        let out = run(&command(&url, event, &id)).await;
        let err = stderr(&out);
        match out.status.code() {
            Some(0) => {
                // The commit's answer was lost and the server was asked.
                resolved += usize::from(err.contains("during COMMIT"));
                written.push((event, id));
                paced(false);
            }
            Some(3) => {
                assert_eq!(
                    count(&db, event, &id).await,
                    0,
                    "exit 3 for {id}, which was written:\n{err}"
                );
                absent += 1;
                paced(true);
            }
            Some(5) => {
                assert!(err.contains(&id), "exit 5 without the id {id}:\n{err}");
                assert!(err.contains("may have been written"), "{err}");
                in_doubt.push((event, id));
                paced(true);
            }
            other => panic!(
                "exit {other:?} for {id}\nstdout:\n{}\nstderr:\n{err}",
                stdout(&out)
            ),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let terminated = killer.await.unwrap();
    assert!(terminated > 0, "the test terminated no session");

    // Every written one is there once; every one in doubt, retried as its
    // message says, is there once; a written event emitted again is not
    // written twice.
    for (event, id) in &written {
        assert_eq!(count(&db, *event, id).await, 1, "{id} exited 0");
    }
    for (event, id) in &in_doubt {
        let out = run(&command(&db.url, *event, id)).await;
        assert!(out.status.success(), "retry of {id}: {}", stderr(&out));
        assert_eq!(count(&db, *event, id).await, 1, "{id} retried");
    }
    let (_, first_event) = written
        .iter()
        .find(|(event, _)| *event)
        .expect("some emit succeeded between terminations");
    let again = run(&command(&db.url, true, first_event)).await;
    assert!(
        stdout(&again).contains("was emitted before: nothing written"),
        "{}",
        stderr(&again)
    );
    assert_eq!(count(&db, true, first_event).await, 1);
    eprintln!(
        "{i} commands: {} written ({resolved} of them after asking the server), {absent} \
         refused with nothing written, {} in doubt, {terminated} sessions terminated; the \
         terminator's pause ended at {} ms",
        written.len(),
        in_doubt.len(),
        pace.load(Ordering::Relaxed)
    );
}

/// Waits until one of the command's sessions waits in COMMIT for a
/// synchronous standby (its commit is in the local WAL: whatever happens
/// to the connection now, the transaction has committed).
async fn waiting_for_standby(
    pool: &sqlx::PgPool,
    command: tokio::task::JoinHandle<std::process::Output>,
) -> (i32, tokio::task::JoinHandle<std::process::Output>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND wait_event = 'SyncRep'",
        )
        .bind(APP)
        .fetch_optional(pool)
        .await
        .unwrap();
        if let Some(pid) = pid {
            return (pid, command);
        }
        if command.is_finished() {
            let out = command.await.unwrap();
            panic!(
                "the command ended before COMMIT: exit {:?}\n{}\n{}",
                out.status.code(),
                stdout(&out),
                stderr(&out)
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the command never reached COMMIT"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_found_committed_or_reported_in_doubt_and_retried_once() {
    use outbox_worker::local_postgres::{LocalPostgres, LocalPostgresOptions};
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    // Synchronous replication to a standby that never comes: a COMMIT
    // writes its record locally, then waits; ending the session there
    // commits the transaction while its client sees only an error.
    let options = LocalPostgresOptions {
        extra_settings: vec![
            "synchronous_standby_names = 'nobody'".to_owned(),
            // The private cluster's default for tests is off, which skips
            // the wait.
            "synchronous_commit = on".to_owned(),
        ],
        ..LocalPostgresOptions::default()
    };
    let cluster = Arc::new(
        tokio::task::spawn_blocking(move || LocalPostgres::start(&options))
            .await
            .unwrap()
            .expect("start a private PostgreSQL"),
    );
    let base = cluster.url("postgres");
    let url = format!("{base}?application_name={APP}");
    // The test's own sessions commit without waiting for the standby.
    let local: PgConnectOptions = base.parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy_with(local.options([("synchronous_commit", "local")]));
    outbox::migrate(&pool).await.unwrap();
    let events = |id: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM outbox_event_log WHERE id = $1::uuid",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };

    // The session is terminated in COMMIT: the command asks the server,
    // learns that its transaction committed, and succeeds.
    let id = outbox::events::new_event_id();
    let emit = tokio::spawn({
        let args = command(&url, true, &id);
        async move { run(&args).await }
    });
    let (pid, emit) = waiting_for_standby(&pool, emit).await;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&pool)
        .await
        .unwrap();
    let out = emit.await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("during COMMIT, but event {id} committed")),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).contains(&id), "{}", stdout(&out));
    assert_eq!(events(id).await, 1);

    // COMMIT waits, and --command-timeout runs out there: the command
    // cannot tell whether its write committed, so it says so (exit 5),
    // naming the id to retry with. (It had: its commit record is local;
    // ending the session that waits makes it visible.)
    let id = outbox::events::new_event_id();
    let emit = tokio::spawn({
        let mut args = command(&url, true, &id);
        args.extend(["--command-timeout".to_owned(), "10s".to_owned()]);
        async move { run(&args).await }
    });
    let (pid, emit) = waiting_for_standby(&pool, emit).await;
    let out = emit.await.unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains("--command-timeout ran out while committing")
            && err.contains(&format!("--id {id}"))
            && err.contains("may have been written"),
        "{err}"
    );
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&pool)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while events(id.clone()).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the event whose COMMIT was left waiting never became visible"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The server goes away in COMMIT and stays away: the command cannot
    // ask, so it says the outcome is unknown, naming the id (exit 5 when
    // --command-timeout runs out while it asks). Rarely, the other session
    // of the command's pool asks before the shutdown reaches it: then the
    // command learns that the event committed, and succeeds.
    let id = outbox::events::new_event_id();
    let emit = tokio::spawn({
        let mut args = command(&url, true, &id);
        args.extend(["--command-timeout".to_owned(), "5s".to_owned()]);
        async move { run(&args).await }
    });
    let (_, emit) = waiting_for_standby(&pool, emit).await;
    let c = Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || c.stop_server())
        .await
        .unwrap()
        .unwrap();
    let out = emit.await.unwrap();
    let err = stderr(&out);
    match out.status.code() {
        Some(5) => assert!(
            err.contains(&format!("--id {id}")) && err.contains("may have been written"),
            "{err}"
        ),
        Some(0) => {
            assert!(
                err.contains(&format!("during COMMIT, but event {id} committed")),
                "{err}"
            );
            assert!(stdout(&out).contains(&id), "{}", stdout(&out));
        }
        other => panic!("exit {other:?}: {err}"),
    }

    // Back, without the standby: the retry the message names finds the
    // event committed and writes nothing.
    let c = Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || c.start_again())
        .await
        .unwrap()
        .unwrap();
    sqlx::query("ALTER SYSTEM SET synchronous_standby_names = ''")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&pool)
        .await
        .unwrap();
    let out = run(&command(&url, true, &id)).await;
    assert!(
        stdout(&out).contains("was emitted before: nothing written"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(events(id).await, 1);
}
