//! Through a real PgBouncer in transaction mode, lending a handful of
//! server sessions to many more client sessions: the worker, its relay,
//! durable steps and the application's submits and emits; a worker killed
//! with -9 behind it; PostgreSQL restarted behind it; polling without
//! LISTEN, and LISTEN on a direct connection beside it. And the two
//! reasons the engine needs a mode for it, shown on the pooler itself.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outbox::events::{Event, emit};
use outbox::relay::Relay;
use outbox::{HandlerResult, Outcome, TaskContext, TaskHandler, Worker, WorkerConfig, outbox_task};
use outbox_tests::pooler::Pgbouncer;
use outbox_tests::process::{WorkerProcess, wait_until};
use outbox_tests::sinks::Capture;
use outbox_tests::tasks::{Record, create_executions_table};
use outbox_tests::{RunningWorker, TestDb};
use outbox_worker::local_postgres::LocalPostgres;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

use crate::WORKER;
use crate::restart::{on, outage_config, private_cluster};

/// Server sessions the pooler lends: far fewer than the clients' sessions
/// (a worker alone opens a dozen), so they change hands all the time.
const SERVER_SESSIONS: u32 = 3;

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "test.pooler.bounce", queue = "bounce", retry_delays = ["100ms", "100ms", "100ms", "100ms", "100ms"])]
struct Bounce {
    n: i64,
}

/// Doubles `n` in a durable step (recorded through the pooler), writes
/// the result in the application's own transaction, and counts its runs.
#[derive(Clone, Default)]
struct Bouncer(Arc<AtomicUsize>);

impl TaskHandler<Bounce> for Bouncer {
    async fn handle(&self, ctx: TaskContext, task: Bounce) -> HandlerResult {
        self.0.fetch_add(1, Ordering::Relaxed);
        let doubled: i64 = ctx
            .step("double", || async {
                Ok::<_, outbox::HandlerError>(task.n * 2)
            })
            .await?;
        let mut tx = outbox::pooler::begin(ctx.pool()).await?;
        sqlx::query("INSERT INTO bounced (task_id, doubled) VALUES ($1, $2)")
            .bind(ctx.id().0)
            .bind(doubled)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Outcome::Success)
    }
}

async fn create_bounced_table(pool: &PgPool) {
    sqlx::raw_sql("CREATE TABLE bounced (task_id bigint NOT NULL, doubled bigint NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

/// Submits `tasks` Bounce tasks and emits one event with each, `per_tx` to
/// a transaction, through `pool` (the pooler's).
async fn submit_and_emit(pool: &PgPool, tasks: i64, per_tx: i64) {
    for start in (0..tasks).step_by(per_tx as usize) {
        let mut tx = outbox::pooler::begin(pool).await.unwrap();
        for n in start..(start + per_tx).min(tasks) {
            outbox::submit(&mut tx, Bounce { n }).await.unwrap();
            emit(
                &mut tx,
                Event::new(
                    "bounce",
                    n.to_string(),
                    "submitted",
                    serde_json::json!({"n": n}),
                ),
            )
            .await
            .unwrap();
        }
        tx.commit().await.unwrap();
    }
}

/// A worker of the bounce queue (`concurrency` slots) on `pool`.
fn bounce_worker(
    pool: &PgPool,
    handler: Bouncer,
    concurrency: usize,
    config: WorkerConfig,
) -> RunningWorker {
    RunningWorker::start(
        Worker::builder(pool.clone())
            .config(config)
            .handler::<Bounce>(handler)
            .queue("bounce", concurrency)
            .build()
            .unwrap(),
    )
}

async fn completed(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks WHERE state = 'completed'")
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_its_relay_and_the_application_all_work_through_pgbouncer() {
    const TASKS: i64 = 2000;
    let db = TestDb::migrated().await;
    let Some(bouncer) = Pgbouncer::start(SERVER_SESSIONS).await else {
        return;
    };
    create_bounced_table(&db.pool).await;
    let pool = bouncer.pool(&db.url, 8).await;
    submit_and_emit(&pool, TASKS, 50).await;

    let sink = Capture::default();
    let runs = Bouncer::default();
    let worker = RunningWorker::start(
        Worker::builder(pool.clone())
            .config(WorkerConfig {
                poll_interval: Duration::from_millis(50),
                ..WorkerConfig::default()
            })
            .handler::<Bounce>(runs.clone())
            .queue("bounce", 16)
            .relay(
                Relay::new("pooled", sink.clone())
                    .partitions(2)
                    .poll_interval(Duration::from_millis(20)),
            )
            .build()
            .unwrap(),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (done, published) = (completed(&db.pool).await, sink.got.lock().unwrap().len());
        if done == TASKS && published >= TASKS as usize {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "through pgbouncer: {done} of {TASKS} tasks completed, {published} of {TASKS} events published\n{}",
            bouncer.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.stop().await;

    let retried: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks WHERE retry_count > 0")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let (rows, right): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE b.doubled = 2 * (t.payload->>'n')::bigint) \
         FROM bounced b JOIN outbox_all_tasks t ON t.id = b.task_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let distinct: HashSet<String> = sink
        .got
        .lock()
        .unwrap()
        .iter()
        .map(|(m, _)| m.aggregate_id.clone())
        .collect();
    eprintln!(
        "pgbouncer ({SERVER_SESSIONS} server sessions): {TASKS} tasks completed, {} runs, {retried} retried; \
         {} events published ({} distinct)",
        runs.0.load(Ordering::Relaxed),
        sink.got.lock().unwrap().len(),
        distinct.len()
    );
    assert_eq!(retried, 0, "no attempt failed on the pooler");
    assert_eq!(
        (rows, right),
        (TASKS, TASKS),
        "every handler's write, right"
    );
    assert_eq!(distinct.len(), TASKS as usize, "every event published");
}

#[tokio::test]
async fn pgbouncer_refuses_startup_options_and_mixes_up_named_statements_without_the_pooler_mode() {
    let db = TestDb::migrated().await;
    let Some(bouncer) = Pgbouncer::start(1).await else {
        return;
    };
    let options: PgConnectOptions = bouncer.url(&db.url).parse().unwrap();

    // The limits a direct worker session carries from its first statement.
    let refused = PgConnection::connect_with(
        &outbox::pooler::session_options(options.clone()).options([("statement_timeout", "5000")]),
    )
    .await
    .expect_err("pgbouncer refuses startup options");
    assert!(
        refused
            .to_string()
            .contains("unsupported startup parameter"),
        "{refused}"
    );

    // Two client sessions without a statement cache, one server session:
    // sqlx names each statement all the same, and the second client meets
    // the first one's name on the server, unless its transaction begins by
    // dropping them (as outbox::pooler::begin does on a marked pool).
    let uncached = outbox::pooler::session_options(options.clone());
    let mut first = PgConnection::connect_with(&uncached).await.unwrap();
    let mut second = PgConnection::connect_with(&uncached).await.unwrap();
    let select = "SELECT $1::int";
    let mut tx = first.begin().await.unwrap();
    sqlx::query(select).bind(1).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = second.begin().await.unwrap();
    let clash = sqlx::query(select).bind(2).execute(&mut *tx).await.err();
    drop(tx);
    assert!(
        clash
            .as_ref()
            .is_some_and(|e| e.to_string().contains("already exists")),
        "a plain BEGIN meets the other client's statement: {clash:?}"
    );
    let mut tx = second.begin_with(outbox::pooler::BEGIN).await.unwrap();
    sqlx::query(select).bind(3).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn a_worker_killed_behind_pgbouncer_loses_nothing() {
    const TASKS: i64 = 30;
    let db = TestDb::migrated().await;
    let Some(bouncer) = Pgbouncer::start(SERVER_SESSIONS).await else {
        return;
    };
    create_executions_table(&db.pool).await;
    let pool = bouncer.pool(&db.url, 4).await;
    let mut tx = outbox::pooler::begin(&pool).await.unwrap();
    outbox::submit_batch(&mut tx, (0..TASKS).map(|_| Record { ms: 400 }))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let url = bouncer.url(&db.url);
    let args = [crate::kill::FAST_RECOVERY, &["--pooler"]].concat();
    let mut first = WorkerProcess::spawn(WORKER, &url, &args);
    wait_until(
        &db.pool,
        "SELECT count(*) FILTER (WHERE state = 'completed') >= 8 \
         AND count(*) FILTER (WHERE state = 'processing') >= 4 FROM outbox_all_tasks",
        Duration::from_secs(60),
    )
    .await;
    first.signal("KILL");
    let status = first.wait(Duration::from_secs(10)).await;
    assert!(!status.success(), "killed: {status:?}");

    let mut second = WorkerProcess::spawn(WORKER, &url, &args);
    wait_until(
        &db.pool,
        "SELECT count(*) = 30 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(90),
    )
    .await;
    assert!(second.is_running(), "{}", second.log());
    let (executions, never_ran, recovered): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM executions), \
                (SELECT count(*) FROM outbox_all_tasks t \
                  WHERE NOT EXISTS (SELECT 1 FROM executions e WHERE e.task_id = t.id)), \
                (SELECT count(*) FROM outbox_all_tasks \
                  WHERE last_error LIKE 'worker lost (heartbeat expired)%')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    eprintln!(
        "kill -9 behind pgbouncer: {TASKS} of {TASKS} COMPLETED, {recovered} recovered, \
         {executions} executions"
    );
    assert_eq!(never_ran, 0, "every task ran");
    assert!(recovered >= 1, "the kill caught tasks in flight, recovered");
    assert!(
        !second.log().contains("prepared statement"),
        "{}",
        second.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_behind_pgbouncer_loses_nothing_and_reruns_nothing_unseen() {
    const TASKS: i64 = 3000;
    let (cluster, url) = private_cluster().await;
    let direct = TestDb::pool_on(&url, 4).await;
    outbox::migrate(&direct).await.unwrap();
    create_bounced_table(&direct).await;
    let Some(bouncer) = Pgbouncer::start_in_front_of(
        &url.parse::<PgConnectOptions>().unwrap(),
        None,
        SERVER_SESSIONS,
    )
    .await
    else {
        return;
    };
    let pool = bouncer.pool(&url, 8).await;
    submit_and_emit(&pool, TASKS, 100).await;

    let runs = Bouncer::default();
    // The test is about a restart shorter than the heartbeat timeout:
    // nothing may be taken for lost. At outage_config's 2 s, a restart that
    // took longer on a loaded machine (CI: once) left the worker unable to
    // vouch for its tasks, and it let go of them, as it must; 20 s keeps
    // the restart well inside the timeout.
    let config = WorkerConfig {
        heartbeat_timeout: Duration::from_secs(20),
        ..outage_config()
    };
    let worker = bounce_worker(&pool, runs.clone(), 16, config);
    let began = std::time::Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let mut restarted = false;
    loop {
        let done = completed(&direct).await;
        if done == TASKS {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{done} of {TASKS} completed\n{}",
            bouncer.log()
        );
        if !restarted && done >= 1000 {
            restarted = true;
            on(&cluster, LocalPostgres::restart).await;
            eprintln!(
                "pgbouncer: PostgreSQL restarted behind it after {done} completions ({:?} in)",
                began.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained = began.elapsed();
    worker.stop().await;
    let rows: i64 = sqlx::query_scalar("SELECT count(DISTINCT task_id) FROM bounced")
        .fetch_one(&direct)
        .await
        .unwrap();
    let executions = runs.0.load(Ordering::Relaxed) as i64;
    // A handler whose own statement the restart cut off failed, and its
    // retry is a counted attempt; nothing else may run a task again.
    let (attempts, recovered): (i64, i64) = sqlx::query_as(
        "SELECT sum(retry_count + 1)::bigint, \
                count(*) FILTER (WHERE last_error LIKE 'worker lost%') FROM outbox_all_tasks",
    )
    .fetch_one(&direct)
    .await
    .unwrap();
    eprintln!(
        "pgbouncer restart: {TASKS} of {TASKS} COMPLETED in {drained:?}; {executions} executions, \
         {} of them retries of a handler whose statement the restart cut off",
        executions - TASKS
    );
    assert_eq!(rows, TASKS, "every task's write is there");
    assert_eq!(recovered, 0, "no task was taken for lost");
    assert_eq!(
        executions, attempts,
        "every execution is an attempt the database counted: none ran twice unseen"
    );
}

/// A migrated database with the bounced table, and a pool of 4 on it
/// through `bouncer`.
async fn bounced_db(bouncer: &Pgbouncer) -> (TestDb, PgPool) {
    let db = TestDb::migrated().await;
    create_bounced_table(&db.pool).await;
    let pool = bouncer.pool(&db.url, 4).await;
    (db, pool)
}

/// Waits until the worker is idle, submits one task through the pooler and
/// returns how long it took to complete.
async fn pickup(db: &TestDb, pool: &PgPool) -> Duration {
    wait_until(
        &db.pool,
        "SELECT count(*) = 1 FROM outbox_workers",
        Duration::from_secs(30),
    )
    .await;
    let started = std::time::Instant::now();
    let mut tx = outbox::pooler::begin(pool).await.unwrap();
    outbox::submit(&mut tx, Bounce { n: 1 }).await.unwrap();
    tx.commit().await.unwrap();
    wait_until(
        &db.pool,
        "SELECT count(*) = 1 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(60),
    )
    .await;
    started.elapsed()
}

#[tokio::test]
async fn behind_pgbouncer_a_worker_polls_or_listens_on_a_direct_connection() {
    let Some(bouncer) = Pgbouncer::start(SERVER_SESSIONS).await else {
        return;
    };
    // Poll only: no LISTEN reaches the server through the pooler.
    let (db, pool) = bounced_db(&bouncer).await;
    let worker = bounce_worker(
        &pool,
        Bouncer::default(),
        4,
        WorkerConfig {
            poll_interval: Duration::from_millis(300),
            ..WorkerConfig::default()
        },
    );
    let polled = pickup(&db, &pool).await;
    worker.stop().await;
    let listening: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND datname = current_database()",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(listening, 0, "no LISTEN through the pooler");

    // A poll an hour apart: only a notification on the direct connection
    // can start the task.
    let (db, pool) = bounced_db(&bouncer).await;
    let worker = bounce_worker(
        &pool,
        Bouncer::default(),
        4,
        WorkerConfig {
            poll_interval: Duration::from_secs(3600),
            listen_options: Some(db.url.parse::<PgConnectOptions>().unwrap()),
            ..WorkerConfig::default()
        },
    );
    // Listening (so the wake-up at connect is behind us).
    wait_until(
        &db.pool,
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE query LIKE 'LISTEN%' \
         AND datname = current_database())",
        Duration::from_secs(30),
    )
    .await;
    let notified = pickup(&db, &pool).await;
    worker.stop().await;
    eprintln!("pgbouncer pickup: {polled:?} polling every 300ms, {notified:?} on a direct LISTEN");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_the_servers_statement_timeout_still_ends_a_blocked_call() {
    let db = TestDb::migrated().await;
    let Some(bouncer) = Pgbouncer::start(SERVER_SESSIONS).await else {
        return;
    };
    let pool = bouncer.pool(&db.url, 4).await;
    let worker = bounce_worker(
        &pool,
        Bouncer::default(),
        4,
        WorkerConfig {
            poll_interval: Duration::from_millis(50),
            statement_timeout: Duration::from_secs(1),
            ..WorkerConfig::default()
        },
    );
    // The queue's row exists once the worker has claimed.
    wait_until(
        &db.pool,
        "SELECT EXISTS (SELECT 1 FROM outbox_queues WHERE name = 'bounce')",
        Duration::from_secs(30),
    )
    .await;
    // Claims wait for this lock. Without the server's timeout, a claim the
    // worker gave up on would wait on the server (through the pooler) for
    // as long as the lock is held.
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM outbox_queues WHERE name = 'bounce' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let held = std::time::Instant::now();
    let mut longest = 0.0f64;
    while held.elapsed() < Duration::from_secs(6) {
        let wait: f64 = sqlx::query_scalar(
            "SELECT coalesce(max(extract(epoch FROM now() - query_start)), 0)::float8 \
             FROM pg_stat_activity WHERE application_name LIKE 'outbox %' \
             AND wait_event_type = 'Lock' AND datname = current_database()",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        longest = longest.max(wait);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    holder.rollback().await.unwrap();
    worker.stop().await;
    eprintln!(
        "pgbouncer: a blocked claim waited at most {longest:.2}s under a 1s statement_timeout"
    );
    assert!(longest > 0.3, "the claims were blocked ({longest:.2}s)");
    assert!(
        longest < 4.0,
        "the server ended each blocked claim at its statement_timeout: {longest:.2}s"
    );
}
