//! A network that goes silent: a fault proxy between a worker process and
//! PostgreSQL keeps every socket open and forwards nothing, so neither side
//! sees an error. The silent leader loses its role, its tasks are recovered
//! by a healthy worker within the bound, its late outcomes are fenced when
//! the network returns, and a silent worker told to stop exits in time.
//! The first also behind PgBouncer, silent between the worker and the
//! pooler.

use std::time::{Duration, Instant};

use outbox::Batch;
use outbox_tests::TestDb;
use outbox_tests::pooler::Pgbouncer;
use outbox_tests::process::{WorkerProcess, wait_until};
use outbox_tests::proxy::FaultProxy;
use outbox_tests::tasks::{
    Guarded, Record, assert_one_at_a_time, create_executions_table, create_intervals_table,
};

use crate::WORKER;

/// Fast settings, so that the bounds are seconds.
const ARGS: &[&str] = &[
    "--queue",
    "record=4",
    "--poll-interval",
    "100ms",
    "--maintenance-interval",
    "200ms",
    "--heartbeat-interval",
    "200ms",
    "--heartbeat-timeout",
    "2s",
    "--statement-timeout",
    "1s",
    "--keepalive",
    "2s",
    "--shutdown-grace",
    "1s",
    "--flush-timeout",
    "2s",
];
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(1);
const MAINTENANCE_INTERVAL: Duration = Duration::from_millis(200);
/// How long a silent worker's row says it is alive: three heartbeat
/// intervals, at least 3 s. Recovery waits for it as well as for the
/// heartbeat timeout.
const ROW_ALIVE: Duration = Duration::from_secs(3);
/// Slack for a shared, noisy machine on top of every bound.
const SLACK: Duration = Duration::from_secs(3);

/// Whether the maintenance lease is held, now, by the process `pid`.
async fn leads(db: &TestDb, pid: u32) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM outbox_leases \
         WHERE name = $1 AND expires_at > now() AND holder LIKE $2)",
    )
    .bind(outbox::MAINTENANCE_LEASE)
    .bind(format!("%:{pid}:%"))
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Polls `check` every 20 ms until it holds; returns how long it took from
/// `since`. Panics with `what` after `within`.
async fn until<F, Fut>(since: Instant, within: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    loop {
        if check().await {
            return since.elapsed();
        }
        assert!(since.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_leader_is_replaced_its_tasks_recovered_and_its_late_outcomes_fenced() {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    let (proxy, proxied) = FaultProxy::start(&db.url).await;
    let bound = HEARTBEAT_TIMEOUT.max(ROW_ALIVE) + 3 * MAINTENANCE_INTERVAL;
    silent_leader(
        &db,
        &proxy,
        &proxied,
        ARGS,
        bound,
        "the longer of the heartbeat timeout and the worker row's life + 3 maintenance intervals",
        false,
    )
    .await;
}

/// The same with every task submitted alone, so through the intake: A
/// moves A's four, and the twenty submitted while A is silent wait in the
/// intake until B moves them (by its claims, or by its maintenance once it
/// leads: either is a move, and `intake::` tests each alone). Nothing is
/// lost or run twice but what A had in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_leaders_tasks_submitted_one_by_one_are_recovered_and_later_ones_run_once() {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    let (proxy, proxied) = FaultProxy::start(&db.url).await;
    let bound = HEARTBEAT_TIMEOUT.max(ROW_ALIVE) + 3 * MAINTENANCE_INTERVAL;
    silent_leader(
        &db,
        &proxy,
        &proxied,
        ARGS,
        bound,
        "the longer of the heartbeat timeout and the worker row's life + 3 maintenance intervals",
        true,
    )
    .await;
}

/// The same behind PgBouncer in transaction mode, the silence between A
/// and the pooler. A's engine calls are transactions of several round
/// trips there, so the silence can fall inside one: the server keeps it
/// open, holding its row locks (a heartbeat's, the lease's) against B's
/// recovery, until the transaction's own idle-in-transaction limit (twice
/// the client's deadline: 2 x (1 s + 1 s)) ends it. That is the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_a_silent_leader_is_replaced_its_tasks_recovered_and_its_late_outcomes_fenced()
 {
    let db = TestDb::migrated().await;
    let Some(bouncer) = Pgbouncer::start(3).await else {
        return;
    };
    create_executions_table(&db.pool).await;
    let (proxy, proxied) = FaultProxy::start(&bouncer.url(&db.url)).await;
    let args = [ARGS, &["--pooler"]].concat();
    let idle_in_transaction = 2 * (STATEMENT_TIMEOUT + outbox::CLIENT_MARGIN);
    let bound =
        HEARTBEAT_TIMEOUT.max(idle_in_transaction).max(ROW_ALIVE) + 3 * MAINTENANCE_INTERVAL;
    silent_leader(
        &db,
        &proxy,
        &proxied,
        &args,
        bound,
        "idle-in-transaction limit + 3 maintenance intervals",
        false,
    )
    .await;
}

/// Worker A (`a_args`, on `a_url` through `proxy`) leads and runs four
/// tasks; B, direct, waits. The proxy goes silent: B must take the lease
/// and recover A's tasks within `bound` (plus slack), run them again, and
/// when the network returns, A's late outcomes must be fenced out. With
/// `one_by_one`, each task is submitted alone (into the intake), and twenty
/// more short ones while A is silent, which B alone runs, once each.
async fn silent_leader(
    db: &TestDb,
    proxy: &FaultProxy,
    a_url: &str,
    a_args: &[&str],
    bound: Duration,
    bound_is: &str,
    one_by_one: bool,
) {
    // A leads and runs every task; B, connected directly, has nothing to do.
    let a = WorkerProcess::spawn(WORKER, a_url, a_args);
    until(Instant::now(), Duration::from_secs(30), "A to lead", || {
        leads(db, a.pid())
    })
    .await;
    let ids = if one_by_one {
        let mut conn = db.conn().await;
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(
                outbox::submit(&mut conn, Record { ms: 4000 })
                    .await
                    .unwrap(),
            );
        }
        ids
    } else {
        let mut batch = Batch::new();
        for _ in 0..4 {
            batch.push(&Record { ms: 4000 }).unwrap();
        }
        batch.submit(&mut *db.conn().await).await.unwrap()
    };
    wait_until(
        &db.pool,
        "SELECT count(*) = 4 FROM executions",
        Duration::from_secs(30),
    )
    .await;
    let b = WorkerProcess::spawn(WORKER, &db.url, ARGS);
    let b_sessions = format!("{} %:{}:%", outbox::ENGINE_APPLICATION_NAME, b.pid());
    until(
        Instant::now(),
        Duration::from_secs(30),
        "B to connect",
        || async {
            sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name LIKE $1)",
            )
            .bind(&b_sessions)
            .fetch_one(&db.pool)
            .await
            .unwrap()
        },
    )
    .await;

    proxy.blackhole();
    let silent_at = Instant::now();
    let mut later = Vec::new();
    if one_by_one {
        let mut conn = db.conn().await;
        for _ in 0..20 {
            later.push(outbox::submit(&mut conn, Record { ms: 10 }).await.unwrap());
        }
    }
    let took_lead = until(silent_at, bound + SLACK, "B to take the lease", || {
        leads(db, b.pid())
    })
    .await;
    let recovered = until(
        silent_at,
        bound + SLACK,
        "A's tasks to be recovered",
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT count(*) = 4 FROM outbox_all_tasks WHERE retry_count = 1 \
             AND last_error LIKE 'worker lost (heartbeat expired)%'",
            )
            .fetch_one(&db.pool)
            .await
            .unwrap()
        },
    )
    .await;
    eprintln!(
        "black-holed leader: B led {took_lead:?} and had recovered A's 4 tasks {recovered:?} \
         after A went silent (bound: {bound_is} = {bound:?})"
    );
    assert!(recovered <= bound + SLACK);

    // B runs them again (attempt 2). A's handlers finish while A is cut
    // off, and its outcomes wait; when the network returns, A writes them
    // late.
    let all_ran = format!("SELECT count(*) = {} FROM executions", 8 + later.len());
    wait_until(&db.pool, &all_ran, Duration::from_secs(30)).await;
    let a_done = format!(
        "SELECT clock_timestamp() > max(at) + interval '4.5 s' FROM executions WHERE pid = {}",
        a.pid()
    );
    until(
        Instant::now(),
        Duration::from_secs(30),
        "A's handlers to end",
        || async {
            sqlx::query_scalar(sqlx::AssertSqlSafe(a_done.as_str()))
                .fetch_one(&db.pool)
                .await
                .unwrap()
        },
    )
    .await;
    proxy.pass();
    let healed = Instant::now();
    while !a
        .log()
        .lines()
        .any(|l| l.contains("database reachable again") && l.contains("completer"))
    {
        assert!(
            healed.elapsed() < Duration::from_secs(30),
            "A's outcome writes never resumed:\n{}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all_completed = format!(
        "SELECT count(*) = {} FROM outbox_all_tasks WHERE state = 'completed'",
        4 + later.len()
    );
    wait_until(&db.pool, &all_completed, Duration::from_secs(30)).await;

    // Each row holds B's outcome: written after B's 4-second attempt ended,
    // never A's stale one.
    for id in ids {
        let (claims, retries, b_outcome_last): (i32, i32, bool) = sqlx::query_as(
            "SELECT t.claims, t.retry_count, \
                    t.finished_at >= (SELECT max(at) FROM executions e WHERE e.task_id = t.id) + interval '3.9 s' \
             FROM outbox_all_tasks t WHERE t.id = $1",
        )
        .bind(id.0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!((claims, retries), (2, 1), "task {id}");
        assert!(
            b_outcome_last,
            "task {id}: A's late outcome was not fenced out"
        );
    }
    let by_pid: Vec<(i64, i64)> =
        sqlx::query_as("SELECT pid, count(*) FROM executions GROUP BY pid ORDER BY min(at)")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        by_pid,
        vec![
            (i64::from(a.pid()), 4),
            (i64::from(b.pid()), 4 + later.len() as i64)
        ]
    );
    // Those submitted while A was silent ran once each, on B.
    for id in later {
        let (claims, retries, runs): (i32, i32, i64) = sqlx::query_as(
            "SELECT t.claims, t.retry_count, \
                    (SELECT count(*) FROM executions e WHERE e.task_id = t.id) \
             FROM outbox_all_tasks t WHERE t.id = $1",
        )
        .bind(id.0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!((claims, retries, runs), (1, 0, 1), "task {id}");
    }
    eprintln!("black-holed leader: A's 4 late outcomes fenced out; B's 4 kept");
}

#[tokio::test]
async fn sigterm_to_a_silent_worker_exits_within_the_bound() {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    let (proxy, proxied) = FaultProxy::start(&db.url).await;
    let mut batch = Batch::new();
    for _ in 0..4 {
        batch.push(&Record { ms: 600_000 }).unwrap();
    }
    let ids = batch.submit(&mut *db.conn().await).await.unwrap();
    let mut worker = WorkerProcess::spawn(WORKER, &proxied, ARGS);
    wait_until(
        &db.pool,
        "SELECT count(*) = 4 FROM executions",
        Duration::from_secs(30),
    )
    .await;

    proxy.blackhole();
    // shutdown grace 1 s + 2 x cancel grace 1 s + flush 2 s.
    let bound = Duration::from_secs(5);
    let took = worker.terminate_within(bound + SLACK).await;
    eprintln!("black-holed worker: SIGTERM to exit took {took:?} (bound {bound:?})");
    worker.assert_left_behind(&ids);
    proxy.pass();
}

/// A worker cut off from the database lets go of its tasks before anyone
/// may take them over: its handlers are told to stop (and aborted after
/// the cancel grace) once three quarters of the heartbeat timeout less
/// the cancel grace passed without a confirmed heartbeat. Otherwise the
/// keyed task recovered by another worker runs twice at once, and the
/// key's next task may start beside the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_worker_stops_its_keyed_handler_before_its_task_is_taken_over() {
    let db = TestDb::migrated().await;
    create_intervals_table(&db.pool).await;
    let (proxy, proxied) = FaultProxy::start(&db.url).await;
    // The hold is let go of 4 x 3/4 - 1 s (cancel grace) = 2 s after the
    // last heartbeat; recovery may take the task 4 s after it.
    let args: &[&str] = &[
        "--queue",
        "guarded=2",
        "--poll-interval",
        "100ms",
        "--maintenance-interval",
        "200ms",
        "--heartbeat-interval",
        "200ms",
        "--heartbeat-timeout",
        "4s",
        "--statement-timeout",
        "1s",
        "--keepalive",
        "2s",
    ];
    let a = WorkerProcess::spawn(WORKER, &proxied, args);
    until(Instant::now(), Duration::from_secs(30), "A to lead", || {
        leads(&db, a.pid())
    })
    .await;
    let mut batch = Batch::new();
    batch
        .push(&Guarded {
            key: "k".into(),
            n: 1,
            ms: 6000,
        })
        .unwrap();
    batch
        .push(&Guarded {
            key: "k".into(),
            n: 2,
            ms: 100,
        })
        .unwrap();
    let ids = batch.submit(&mut *db.conn().await).await.unwrap();
    wait_until(
        &db.pool,
        "SELECT count(*) = 1 FROM intervals WHERE n = 1",
        Duration::from_secs(30),
    )
    .await;
    let b = WorkerProcess::spawn(WORKER, &db.url, args);

    proxy.blackhole();
    let silent_at = Instant::now();
    // B leads, recovers step 1 (attempt 2), runs it, then step 2.
    wait_until(
        &db.pool,
        "SELECT count(*) = 2 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(60),
    )
    .await;
    let took_over = silent_at.elapsed();
    proxy.pass();
    // A's record of when its handler stopped arrives once it can.
    wait_until(
        &db.pool,
        "SELECT count(*) = 0 FROM intervals WHERE finished_at IS NULL",
        Duration::from_secs(60),
    )
    .await;
    let order = assert_one_at_a_time(&db.pool).await;
    assert_eq!(order, vec![("k".to_owned(), vec![1, 1, 2])]);
    let (a_stopped, b_started): (f64, f64) = sqlx::query_as(
        "SELECT extract(epoch FROM (SELECT finished_at FROM intervals WHERE attempt = 1 AND n = 1))::float8, \
                extract(epoch FROM (SELECT started_at FROM intervals WHERE attempt = 2 AND n = 1))::float8",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let (claims, retries): (i32, i32) =
        sqlx::query_as("SELECT claims, retry_count FROM outbox_all_tasks WHERE id = $1")
            .bind(ids[0].0)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (claims, retries),
        (2, 1),
        "recovered once, A's release fenced out"
    );
    assert!(
        a.log().contains("letting go of tasks"),
        "A never said it let go:\n{}",
        a.log()
    );
    eprintln!(
        "black-holed keyed worker: A's handler stopped {:.2} s before B started the task again; \
         both steps done {took_over:?} after A went silent",
        b_started - a_stopped
    );
    drop(b);
}
