//! kill -9 of a worker with tasks in flight.

use std::time::Duration;

use outbox_tests::TestDb;
use outbox_tests::process::{WorkerProcess, wait_until};
use outbox_tests::tasks::{Record, Step, create_executions_table, create_intervals_table};

use crate::WORKER;

const TASKS: i64 = 30;

/// A worker of the record queue that recovers a lost task quickly.
pub(crate) const FAST_RECOVERY: &[&str] = &[
    "--queue",
    "record=8",
    "--poll-interval",
    "100ms",
    "--heartbeat-interval",
    "100ms",
    // A live worker lets go of its tasks when no heartbeat of its own was
    // confirmed for half of this: at 1 s, a stall of half a second on a
    // loaded machine would cancel live tasks, counted then as recovered.
    "--heartbeat-timeout",
    "4s",
    "--maintenance-interval",
    "100ms",
];

/// A worker of the ordered queue that recovers a lost task quickly.
const RUNS: &[&str] = &[
    "--queue",
    "ordered=4",
    "--poll-interval",
    "100ms",
    "--heartbeat-interval",
    "100ms",
    // A live worker lets go of its tasks when no heartbeat of its own was
    // confirmed for half of this: at 1 s, a stall of half a second on a
    // loaded machine would cancel live tasks, counted then as recovered.
    "--heartbeat-timeout",
    "4s",
    "--maintenance-interval",
    "100ms",
];

#[tokio::test]
async fn a_killed_workers_tasks_are_recovered_and_none_is_lost() {
    kill_and_recover(false, false).await;
}

/// The same with the tasks submitted one at a time: each goes through the
/// intake (migration 31), which the killed worker's claims moved from.
#[tokio::test]
async fn a_killed_workers_tasks_submitted_one_by_one_are_recovered_and_none_is_lost() {
    kill_and_recover(false, true).await;
}

/// The same beside a snapshot held open from before the first claim to
/// after the last outcome: the claimable index keeps every entry, the
/// survivor claims from its floor, and the recovered tasks still run.
#[tokio::test]
async fn a_killed_workers_tasks_are_recovered_beside_a_held_snapshot() {
    kill_and_recover(true, false).await;
}

async fn kill_and_recover(hold_snapshot: bool, one_by_one: bool) {
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    if one_by_one {
        let mut conn = db.conn().await;
        for _ in 0..TASKS {
            outbox::submit(&mut conn, Record { ms: 400 }).await.unwrap();
        }
        let in_intake: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_intake")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(in_intake, TASKS, "every task waits in the intake");
    } else {
        outbox::submit_batch(
            &mut *db.conn().await,
            (0..TASKS).map(|_| Record { ms: 400 }),
        )
        .await
        .unwrap();
    }
    let mut holder = db.conn().await;
    if hold_snapshot {
        sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox_tasks")
            .execute(&mut *holder)
            .await
            .unwrap();
    }

    let mut first = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    let in_flight = first.kill_mid_flight(&db.pool, 8, 4).await;
    assert!(in_flight >= 1, "the kill caught tasks in flight");

    let mut second = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    wait_until(
        &db.pool,
        "SELECT count(*) = 30 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(60),
    )
    .await;
    assert!(
        second.is_running(),
        "the second worker keeps running:\n{}",
        second.log()
    );

    let (executions, never_ran, recovered) = after_the_kill(&db.pool, first.pid()).await;
    let duplicates = executions - TASKS;
    if hold_snapshot {
        // Still the one snapshot, from before the first claim: it sees
        // every task pending.
        let pending: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_tasks WHERE state = 'pending' AND claims = 0",
        )
        .fetch_one(&mut *holder)
        .await
        .unwrap();
        assert_eq!(pending, TASKS, "the snapshot stayed open all along");
        sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
    }
    eprintln!(
        "kill -9 (snapshot held: {hold_snapshot}, one by one: {one_by_one}): {in_flight} tasks in flight at the kill; \
         afterwards {TASKS} of {TASKS} COMPLETED, {recovered} recovered, {executions} executions, \
         {duplicates} duplicate executions"
    );
    assert_recovered_once(never_ran, recovered, in_flight, duplicates);
}

/// [`FAST_RECOVERY`] with room for one claim of hundreds.
fn wide() -> Vec<&'static str> {
    let mut args = FAST_RECOVERY.to_vec();
    assert_eq!(args[..2], ["--queue", "record=8"]);
    args[1] = "record=500";
    args
}

/// After a kill of the worker with process id `killed` and a drain by
/// another worker: the handlers' executions, the tasks that never ran, and
/// the tasks stuck-task recovery took back from the killed worker (one
/// counted attempt each). The recovery's error names the claim it ended,
/// whose token begins with the worker's `host:pid:`: a task the draining
/// worker lost itself (held back past its own timeout on a loaded machine)
/// is not one the kill left behind.
async fn after_the_kill(pool: &sqlx::PgPool, killed: u32) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM executions), \
                (SELECT count(*) FROM outbox_all_tasks t \
                 WHERE NOT EXISTS (SELECT 1 FROM executions e WHERE e.task_id = t.id)), \
                (SELECT count(*) FROM outbox_all_tasks WHERE retry_count = 1 \
                 AND last_error LIKE 'worker lost (heartbeat expired): %:' || $1 || ':%')",
    )
    .bind(killed.to_string())
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Every task ran, each one in flight at the kill was recovered once, and
/// only those ran twice.
fn assert_recovered_once(never_ran: i64, recovered: i64, in_flight: i64, duplicates: i64) {
    assert_eq!(never_ran, 0, "every task ran");
    assert_eq!(
        recovered, in_flight,
        "each task in flight at the kill was recovered once, as a counted attempt"
    );
    assert!(
        (0..=in_flight).contains(&duplicates),
        "duplicates ({duplicates}) at most the tasks in flight ({in_flight})"
    );
}

/// A worker killed -9 right after claims of hundreds of tasks (one claim
/// takes up to 1,000): every task it held is recovered once, as a counted
/// attempt, and runs; only those it had started run twice.
#[tokio::test]
async fn a_killed_worker_holding_hundreds_of_tasks_from_one_claim_loses_none() {
    const MANY: i64 = 600;
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    outbox::submit_batch(
        &mut *db.conn().await,
        (0..MANY).map(|_| Record { ms: 2000 }),
    )
    .await
    .unwrap();

    let mut first = WorkerProcess::spawn(WORKER, &db.url, &wide());
    // Killed once some of its handlers have started (each records that
    // first), while every task it claimed is still in flight (2 s each).
    wait_until(
        &db.pool,
        "SELECT count(*) >= 50 FROM executions",
        Duration::from_secs(30),
    )
    .await;
    let in_flight = first.kill_mid_flight(&db.pool, 0, 400).await;
    assert!(
        in_flight >= 400,
        "the kill caught {in_flight} tasks in flight"
    );

    // The worker that drains and recovers runs 500 handlers of its own,
    // and leads: with the fast settings' 4 s timeout, a machine loaded by
    // three suites at once held its heartbeats back long enough that it
    // recovered its own 100 live tasks, counted as attempts and run twice
    // (once in a flake hunt's three runs). Its own timeout, the one
    // recovery judges by, is longer; the killed worker's tasks come back
    // after it.
    let mut patient = wide();
    let at = patient
        .iter()
        .position(|a| *a == "--heartbeat-timeout")
        .expect("the fast settings name a heartbeat timeout");
    patient[at + 1] = "20s";
    let mut second = WorkerProcess::spawn(WORKER, &db.url, &patient);
    let all = format!("SELECT count(*) = {MANY} FROM outbox_all_tasks WHERE state = 'completed'");
    wait_until(&db.pool, &all, Duration::from_secs(90)).await;
    assert!(
        second.is_running(),
        "the second worker keeps running:\n{}",
        second.log()
    );
    let (executions, never_ran, recovered) = after_the_kill(&db.pool, first.pid()).await;
    let duplicates = executions - MANY;
    eprintln!(
        "kill -9 holding one wide claim: {in_flight} tasks in flight at the kill; afterwards \
         {MANY} of {MANY} COMPLETED, {recovered} recovered, {executions} executions, \
         {duplicates} duplicate executions"
    );
    assert_recovered_once(never_ran, recovered, in_flight, duplicates);
}

#[tokio::test]
async fn a_killed_workers_durable_steps_are_not_run_again() {
    use outbox_tests::tasks::TwoSteps;
    const N: i64 = 24;
    let db = TestDb::migrated().await;
    create_executions_table(&db.pool).await;
    outbox::submit_batch(&mut *db.conn().await, (0..N).map(|_| TwoSteps { ms: 600 }))
        .await
        .unwrap();
    let mut first = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    // Killed once 4 tasks recorded their first step and work towards the
    // second (600 ms each).
    wait_until(
        &db.pool,
        "SELECT count(*) >= 4 FROM outbox_durable_steps WHERE name = 'first'",
        Duration::from_secs(30),
    )
    .await;
    let in_flight = first.kill_mid_flight(&db.pool, 0, 1).await;
    let recorded: Vec<i64> = sqlx::query_scalar(
        "SELECT d.task_id FROM outbox_durable_steps d WHERE d.name = 'first' \
         AND NOT EXISTS (SELECT 1 FROM outbox_durable_steps s WHERE s.task_id = d.task_id AND s.name = 'second')",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let recorded_first = recorded.len();
    let mut second = WorkerProcess::spawn(WORKER, &db.url, FAST_RECOVERY);
    wait_until(
        &db.pool,
        &format!("SELECT count(*) = {N} FROM outbox_all_tasks WHERE state = 'completed'"),
        Duration::from_secs(90),
    )
    .await;
    assert!(second.is_running(), "{}", second.log());
    let runs: Vec<(i32, i64, i64)> = sqlx::query_as(
        "SELECT attempt, count(*), count(DISTINCT task_id) FROM executions GROUP BY attempt ORDER BY attempt",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    eprintln!(
        "durable kill -9: {in_flight} tasks in flight, {recorded_first} first steps recorded at the kill; \
         afterwards {N} of {N} completed, executions per step (step, runs, tasks): {runs:?}"
    );
    // Every step of every task ran, and a step cut between its work and
    // its record ran again at most once per task in flight; a recorded
    // first step never ran again (below).
    assert_eq!(runs.len(), 2);
    for (step, executions, tasks) in &runs {
        assert_eq!(*tasks, N, "step {step}");
        assert!(*executions - N <= in_flight, "step {step}: {runs:?}");
    }
    assert!(
        recorded_first >= 1,
        "the kill caught tasks between their steps"
    );
    let rerun: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT task_id FROM executions WHERE attempt = 1 AND task_id = ANY($1) \
         GROUP BY task_id HAVING count(*) > 1) AS twice",
    )
    .bind(&recorded)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(rerun, 0, "a recorded first step ran again");
}

/// kill -9 of a worker holding runs: each claim took a key's next step with
/// the steps waiting behind it (`--key-run`), so most of what the worker
/// holds at the kill are steps claimed behind their key's running one,
/// still blocked in their keys' lines, most of them held in place without
/// a write (migration 56: only a run's head and last task carry the claim).
/// Recovery returns every one of them: a key's running head counting an
/// attempt, the steps of its run without one (they may never have
/// started), the key going to the first step left in its line. The keys go
/// on in order, and every step completes exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_runs_are_recovered_in_key_order_and_each_step_completes_once() {
    const KEYS: i64 = 4;
    const STEPS: i64 = 24;
    let db = TestDb::migrated().await;
    create_intervals_table(&db.pool).await;
    let mut batch = outbox::Batch::new();
    for n in 1..=STEPS {
        for k in 0..KEYS {
            batch.push(&Step::new(&format!("k{k}"), n, 30)).unwrap();
        }
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    let args = [RUNS, &["--key-run", "8"]].concat();
    let mut first = WorkerProcess::spawn(WORKER, &db.url, &args);
    // Killed once it has finished some steps and holds runs: steps claimed
    // behind a key's running one, not started.
    let holding = "SELECT (SELECT count(*) >= 4 FROM intervals WHERE finished_at IS NOT NULL) \
                   AND (SELECT count(*) >= 4 FROM outbox_tasks WHERE state = 'processing' AND blocked)";
    wait_until(&db.pool, holding, Duration::from_secs(60)).await;
    first.signal("KILL");
    first.wait(Duration::from_secs(10)).await;
    // Counted once its last outcome, if one was on its way, has committed
    // or failed (it failed here once: 4 heads held, 3 recovered).
    first.sessions_ended(&db.pool).await;
    let (held, in_runs): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE blocked) FROM outbox_tasks \
         WHERE state = 'processing'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        in_runs >= 4,
        "the kill caught runs: {in_runs} of {held} held"
    );
    // Shown as running under their run's claim, not written as such.
    let unwritten: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_all_tasks AS v JOIN outbox_tasks AS t USING (id) \
         WHERE v.state = 'processing' AND t.state = 'pending' AND t.claimed_by IS NULL",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        unwritten >= 1,
        "the kill caught tasks held in place without a write"
    );

    let mut second = WorkerProcess::spawn(WORKER, &db.url, &args);
    wait_until(
        &db.pool,
        &format!(
            "SELECT count(*) = {} FROM outbox_all_tasks WHERE state = 'completed'",
            KEYS * STEPS
        ),
        Duration::from_secs(120),
    )
    .await;
    second.terminate_within(Duration::from_secs(10)).await;

    // Every step completed once (one row each, none left), in key order:
    // a step started only after the one before it of its key had ended, or
    // after the kill cut that one short and recovery returned it.
    let (rows, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT id) FROM outbox_all_tasks")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((rows, distinct), (KEYS * STEPS, KEYS * STEPS));
    let attempts: Vec<(String, i64, i64, Option<chrono::DateTime<chrono::Utc>>)> =
        sqlx::query_as("SELECT key, n, pid, finished_at FROM intervals ORDER BY key, started_at")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let killed = i64::from(first.pid());
    for pair in attempts.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.0 == b.0 {
            assert!(
                a.1 <= b.1,
                "key {}: step {} ran after step {}",
                a.0,
                b.1,
                a.1
            );
            assert!(
                a.3.is_some() || a.2 == killed,
                "key {}: step {} of a live worker never ended",
                a.0,
                a.1
            );
        }
    }
    let ran: i64 = sqlx::query_scalar("SELECT count(DISTINCT task_id) FROM intervals")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(ran, KEYS * STEPS, "every step ran");
    let (counted, retried): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE last_error LIKE 'worker lost (heartbeat expired)%'), \
                count(*) FILTER (WHERE retry_count > 0) FROM outbox_all_tasks",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    eprintln!(
        "kill -9 holding runs: {held} steps held ({in_runs} of them claimed behind their key's head, \
         and {unwritten} more held in place without a write); {counted} recovered counting an \
         attempt; {} attempts for {} steps",
        attempts.len(),
        KEYS * STEPS
    );
    assert_eq!(
        (counted, retried),
        (held - in_runs, held - in_runs),
        "each head held at the kill was recovered once, counting an attempt; the steps of its \
         run without one"
    );
}

/// kill -9 of a worker on a queue whose keys run two tasks at once (per-key
/// concurrency 2: no claim ahead, and a hand-over that leaves a key's next
/// task to the claims while an earlier one waits for a claim). Recovery
/// returns what it held; every step completes exactly once, and the worker
/// that drains never runs more than two of a key at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_of_keys_with_two_places_loses_nothing() {
    const KEYS: i64 = 4;
    const STEPS: i64 = 16;
    let db = TestDb::migrated().await;
    create_intervals_table(&db.pool).await;
    outbox::admin::set_queue(
        &db.pool,
        "ordered",
        &outbox::admin::QueueChange::new().per_key_concurrency(2),
    )
    .await
    .unwrap();
    let mut batch = outbox::Batch::new();
    for n in 1..=STEPS {
        for k in 0..KEYS {
            batch.push(&Step::new(&format!("k{k}"), n, 30)).unwrap();
        }
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    let mut first = WorkerProcess::spawn(WORKER, &db.url, RUNS);
    let in_flight = first.kill_mid_flight(&db.pool, 4, 2).await;

    let mut second = WorkerProcess::spawn(WORKER, &db.url, RUNS);
    wait_until(
        &db.pool,
        &format!(
            "SELECT count(*) = {} FROM outbox_all_tasks WHERE state = 'completed'",
            KEYS * STEPS
        ),
        Duration::from_secs(120),
    )
    .await;
    second.terminate_within(Duration::from_secs(10)).await;

    let (rows, distinct, ran): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT id), \
                (SELECT count(DISTINCT task_id) FROM intervals) FROM outbox_all_tasks",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (rows, distinct, ran),
        (KEYS * STEPS, KEYS * STEPS, KEYS * STEPS)
    );
    // The draining worker's attempts of one key: never three at once.
    let crowded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM intervals AS a WHERE a.pid <> $1 AND ( \
             SELECT count(*) FROM intervals AS b \
             WHERE b.pid <> $1 AND b.key = a.key \
               AND b.started_at <= a.started_at AND b.finished_at > a.started_at) > 2",
    )
    .bind(i64::from(first.pid()))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(crowded, 0, "three of a key ran at once");
    let recovered: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_all_tasks WHERE retry_count = 1 \
         AND last_error LIKE 'worker lost (heartbeat expired): %:' || $1 || ':%'",
    )
    .bind(first.pid().to_string())
    .fetch_one(&db.pool)
    .await
    .unwrap();
    eprintln!(
        "kill -9 with two places per key: {in_flight} in flight at the kill, {recovered} \
         recovered; {} steps completed once",
        KEYS * STEPS
    );
    assert_eq!(
        recovered, in_flight,
        "each task held at the kill recovered once"
    );
}
