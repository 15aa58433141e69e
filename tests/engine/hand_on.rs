//! Hand-on: the outcome that lets go of an ordering key claims the key's
//! next task for the worker that wrote it, in the same statement, unless
//! the queue is paused or has limits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    CountersSnapshot, HandlerResult, Outcome, TaskContext, TaskHandler, TaskOptions, Worker,
    WorkerConfig, WorkerCounters, admin, outbox_task,
};
use outbox_tests::process::{wait_for_condition, wait_until};
use outbox_tests::tasks::{IntervalRecorder, Step, assert_one_at_a_time, create_intervals_table};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use super::ordering::step;

/// A worker that neither listens nor polls within the test's time: only
/// the worker itself (a hand-on, or the wake-up after its own outcome) can
/// move a key on. Its claims take a key's next task alone (no run behind
/// it, see key_runs.rs), so every step is handed on.
fn quiet_config() -> WorkerConfig {
    WorkerConfig {
        listen: false,
        poll_interval: Duration::from_secs(3600),
        key_run: 1,
        ..WorkerConfig::default()
    }
}

/// Submits `steps` steps of `key` (no work each), drains them with a quiet
/// worker of concurrency 4 (deleting successful tasks at once if `delete`),
/// checks they ran one at a time in order, and returns the worker's
/// counters.
async fn drain_one_key(db: &TestDb, key: &str, steps: i64, delete: bool) -> CountersSnapshot {
    create_intervals_table(&db.pool).await;
    let mut batch = outbox::Batch::new();
    for n in 1..=steps {
        batch.push(&step(key, n, 0)).unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    let worker = Worker::builder(db.pool.clone())
        .config(WorkerConfig {
            delete_completed: delete,
            ..quiet_config()
        })
        .handler::<Step>(IntervalRecorder)
        .queue("ordered", 4)
        .build()
        .unwrap();
    let counters = worker.counters();
    let running = RunningWorker::start(worker);
    wait_until(
        &db.pool,
        &format!(
            "SELECT (SELECT count(*) = {steps} FROM outbox_all_tasks WHERE state = 'completed') \
             OR ({delete} AND NOT EXISTS (SELECT 1 FROM outbox_tasks))"
        ),
        Duration::from_secs(60),
    )
    .await;
    running.stop().await;
    let by_key = assert_one_at_a_time(&db.pool).await;
    assert_eq!(by_key, vec![(key.to_owned(), (1..=steps).collect())]);
    counters.snapshot()
}

#[tokio::test]
async fn a_hot_key_goes_from_each_outcome_straight_to_its_next_task() {
    for delete in [false, true] {
        let db = TestDb::migrated().await;
        let c = drain_one_key(&db, "hot", STEPS, delete).await;
        eprintln!(
            "hand-on (successes deleted: {delete}): {STEPS} steps of one key, {} handed on, \
             {} claim statements",
            c.tasks_handed_on, c.claim_queries
        );
        assert_most_handed_on(&c);
    }
}

/// Steps of the hot-key test.
const STEPS: i64 = 40;

fn assert_most_handed_on(c: &CountersSnapshot) {
    // Every step but the first can be handed on; an offer finds no place
    // only while the producer's own claim holds them, which is rare with no
    // poll and no NOTIFY.
    assert!(
        c.tasks_handed_on >= (STEPS as u64 - 1) / 2,
        "most steps were handed on: {c:?}"
    );
    assert!(c.tasks_handed_on < STEPS as u64, "{c:?}");
}

/// A step that waits until the test lets it finish.
#[derive(Debug, Serialize, Deserialize)]
#[outbox_task(
    task_type = "test.hand_on.gated",
    queue = "hand-on-gated",
    ordering_key = "key"
)]
struct Gated {
    key: String,
    n: i64,
}

/// A gated step's state, blocked flag and claim token.
fn state_of(n: i64) -> String {
    format!(
        "SELECT state::text, blocked, claimed_by FROM outbox_all_tasks \
         WHERE (payload->>'n')::bigint = {n}"
    )
}

/// Holds each key's first step until the test adds a permit; records the
/// order in which steps start.
#[derive(Clone)]
struct Gate(Arc<Semaphore>, Arc<Mutex<Vec<(String, i64)>>>);

impl Default for Gate {
    fn default() -> Self {
        Self(Arc::new(Semaphore::new(0)), Arc::default())
    }
}

impl TaskHandler<Gated> for Gate {
    async fn handle(&self, _ctx: TaskContext, task: Gated) -> HandlerResult {
        self.1.lock().unwrap().push((task.key.clone(), task.n));
        if task.n == 1 {
            self.0.acquire().await.expect("gate open").forget();
        }
        Ok(Outcome::Success)
    }
}

/// A worker of the gated queue with `config` and `concurrency`, its steps
/// run by `gate`.
fn gated_worker(db: &TestDb, config: WorkerConfig, gate: &Gate, concurrency: usize) -> Worker {
    Worker::builder(db.pool.clone())
        .config(config)
        .handler::<Gated>(gate.clone())
        .queue("hand-on-gated", concurrency)
        .build()
        .unwrap()
}

/// A worker on the gated queue, the gate that holds each key's first step,
/// and the worker's counters.
struct GatedRun {
    gate: Gate,
    running: RunningWorker,
    counters: Arc<WorkerCounters>,
}

/// Submits steps 1..=`steps` of `key` at `priority`, starts a worker with
/// `config` and `concurrency` on their queue, and waits until step 1's
/// handler runs (held at the gate).
async fn start_gated(
    db: &TestDb,
    key: &str,
    steps: i64,
    priority: i16,
    config: WorkerConfig,
    concurrency: usize,
) -> GatedRun {
    let mut conn = db.conn().await;
    for n in 1..=steps {
        let gated = Gated {
            key: key.to_owned(),
            n,
        };
        outbox::submit_with(&mut conn, gated, TaskOptions::new().priority(priority))
            .await
            .unwrap();
    }
    drop(conn);
    let gate = Gate::default();
    let worker = gated_worker(db, config, &gate, concurrency);
    let counters = worker.counters();
    let running = RunningWorker::start(worker);
    wait_until(
        &db.pool,
        &format!("SELECT state = 'processing' FROM ({}) AS s", state_of(1)),
        Duration::from_secs(30),
    )
    .await;
    // Claimed is not started: a claim goes to the worker's buffer first,
    // and a shutdown asked before the dispatcher starts step 1 gives it
    // back unstarted (1 run in 16 to 30 on a loaded machine).
    wait_for_condition("step 1 to start", Duration::from_secs(30), || {
        gate.1
            .lock()
            .unwrap()
            .iter()
            .any(|(k, n)| k == key && *n == 1)
    })
    .await;
    GatedRun {
        gate,
        running,
        counters,
    }
}

/// A worker that polls now and then.
fn polling_config() -> WorkerConfig {
    WorkerConfig {
        poll_interval: Duration::from_millis(200),
        key_run: 1,
        ..WorkerConfig::default()
    }
}

#[tokio::test]
async fn a_paused_queue_is_not_handed_on_to_and_runs_the_key_on_after_its_resume() {
    let db = TestDb::migrated().await;
    let run = start_gated(&db, "k", 2, 0, polling_config(), 4).await;
    // Paused while the key's first task runs: its outcome must not claim
    // the second, which a resume then lets run.
    admin::pause_queue(&db.pool, "hand-on-gated").await.unwrap();
    run.gate.0.add_permits(1);
    wait_until(
        &db.pool,
        &format!("SELECT state = 'completed' FROM ({}) AS s", state_of(1)),
        Duration::from_secs(30),
    )
    .await;
    let second: (String, bool, Option<String>) = sqlx::query_as(sqlx::AssertSqlSafe(state_of(2)))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        second,
        ("pending".to_owned(), false, None),
        "handed its key, not claimed"
    );
    admin::resume_queue(&db.pool, "hand-on-gated")
        .await
        .unwrap();
    wait_until(
        &db.pool,
        "SELECT count(*) = 2 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(30),
    )
    .await;
    run.running.stop().await;
    assert_eq!(run.counters.snapshot().tasks_handed_on, 0);
}

#[tokio::test]
async fn a_queue_with_a_global_limit_is_woken_not_handed_on_to() {
    let db = TestDb::migrated().await;
    let limit = admin::QueueChange {
        global_concurrency: Some(Some(1)),
        ..admin::QueueChange::default()
    };
    admin::set_queue(&db.pool, "ordered", &limit).await.unwrap();
    let c = drain_one_key(&db, "limited", 10, false).await;
    assert_eq!(
        c.tasks_handed_on, 0,
        "a queue with limits is claimed under its lock, never by a hand-on"
    );
}

#[tokio::test]
async fn a_hand_on_gives_way_to_a_more_urgent_task_of_its_queue() {
    let db = TestDb::migrated().await;
    // Two places and no claim-ahead, and a worker that hears of no new task
    // by itself: the urgent task is only claimed if the first step's
    // outcome leaves its place to a claim (and wakes the producer for it)
    // instead of handing it to the key's next step.
    let config = WorkerConfig {
        claim_ahead: 0,
        ..quiet_config()
    };
    let run = start_gated(&db, "k", 3, 5, config, 2).await;
    let urgent = Gated {
        key: "urgent".to_owned(),
        n: 99,
    };
    outbox::submit_with(
        &mut *db.conn().await,
        urgent,
        TaskOptions::new().priority(0),
    )
    .await
    .unwrap();
    run.gate.0.add_permits(1);
    wait_until(
        &db.pool,
        "SELECT count(*) = 4 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(30),
    )
    .await;
    run.running.stop().await;
    let started = run.gate.1.lock().unwrap().clone();
    let order: Vec<(&str, i64)> = started.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    assert_eq!(
        order,
        vec![("k", 1), ("urgent", 99), ("k", 2), ("k", 3)],
        "the key's next step waited for the task of higher priority"
    );
}

#[tokio::test]
async fn a_key_whose_lock_row_went_missing_is_still_handed_on() {
    let db = TestDb::migrated().await;
    let run = start_gated(&db, "gone", 2, 0, polling_config(), 2).await;
    // The key's lock row gone while its first step runs (an operator, or a
    // prune that raced): the outcome adds it again and hands the key on.
    sqlx::query("DELETE FROM outbox_keys WHERE ordering_key = 'gone'")
        .execute(&db.pool)
        .await
        .unwrap();
    run.gate.0.add_permits(1);
    wait_until(
        &db.pool,
        "SELECT count(*) = 2 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(30),
    )
    .await;
    run.running.stop().await;
    assert_eq!(
        run.gate.1.lock().unwrap().clone(),
        vec![("gone".to_owned(), 1), ("gone".to_owned(), 2)],
        "each step ran once, in order"
    );
}

/// The hand-over finds the tasks it hands a key by primary key, whatever
/// the statistics say. Analyzed while no task waited for a key (the usual
/// state of a table that has just drained), the table's statistics made
/// the planner read the hand-over's rows through the waiting tasks' index
/// instead, testing each against the ids: every outcome then read every
/// waiting task, and a drain over 1,000 keys ran at 0.07x the unordered
/// drain in one bench run and at 0.5x in the next. Counted in the calling
/// transaction's own statistics, so nothing depends on timing.
#[tokio::test]
async fn the_hand_over_reads_by_primary_key_under_stale_statistics() {
    const WAITING: i64 = 2000;
    let db = TestDb::migrated().await;
    // Statistics that say no task waits for a key, kept while the test runs.
    outbox_tests::tasks::stale_task_statistics(&db.pool, "ordered").await;
    let mut batch = outbox::Batch::new();
    for n in 1..=WAITING + 1 {
        batch.push(&step("k", n, 0)).unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();

    // A session of its own, so the function is planned under these
    // statistics. The key's first task finishes (deleted, as a success
    // leaves the table) and the key is handed on.
    let mut conn = TestDb::pool_on(&db.url, 1).await.acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    sqlx::query("DELETE FROM outbox_tasks WHERE ordering_key = 'k' AND NOT blocked")
        .execute(&mut *conn)
        .await
        .unwrap();
    let before = outbox_tests::tasks::task_index_fetches(&mut conn).await;
    let handed: i32 = sqlx::query_scalar("SELECT outbox_keys_advance('{ordered}', '{k}')")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let after = outbox_tests::tasks::task_index_fetches(&mut conn).await;
    sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
    assert_eq!(handed, 1, "the key went on to its next task");
    assert!(
        after - before < 100,
        "handing one key on fetched {} rows through indexes with {WAITING} tasks waiting",
        after - before
    );
    let next: i64 = sqlx::query_scalar(
        "SELECT (payload->>'n')::bigint FROM outbox_tasks WHERE ordering_key = 'k' AND NOT blocked",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(next, 2, "the key's second task is the one handed on");
}

/// Starts a gated worker with `config` on step 1 of `key`, opens an
/// application transaction that submits step 2 of the key (holding the
/// key's lock until it ends), lets step 1 finish and waits until its
/// outcome is written. Returns the run and the open transaction.
async fn finish_a_step_beside_an_open_submit(
    db: &TestDb,
    key: &str,
    config: WorkerConfig,
) -> (GatedRun, sqlx::Transaction<'static, sqlx::Postgres>) {
    let run = start_gated(db, key, 1, 0, config, 2).await;
    let mut app = db.pool.begin().await.unwrap();
    outbox::submit(
        &mut app,
        Gated {
            key: key.to_owned(),
            n: 2,
        },
    )
    .await
    .unwrap();
    run.gate.0.add_permits(1);
    wait_until(
        &db.pool,
        &format!("SELECT state = 'completed' FROM ({}) AS s", state_of(1)),
        Duration::from_secs(60),
    )
    .await;
    (run, app)
}

/// An application's transaction that submitted a task of key `held` and
/// stays open holds the key's lock row. The outcome that lets go of the
/// key (the key's running step finishing) used to wait for it, and every
/// outcome behind it in the same lane with it: with one lane, nothing the
/// worker finished was written until the application committed. Now the
/// outcome is written at once and the key is handed on once the lock is
/// free, here after the worker's sessions were terminated meanwhile.
#[tokio::test]
async fn an_open_submit_of_a_key_holds_up_no_outcome_and_gets_its_key_after_its_commit() {
    let db = TestDb::migrated().await;
    // Step 1 of `held` finishes, and then a task of another key.
    let (run, app) = finish_a_step_beside_an_open_submit(
        &db,
        "held",
        WorkerConfig {
            finish_lanes: 1,
            // Maintenance (which also hands on keys with a free place) does
            // not run its cleanup again within the test.
            cleanup_interval: Duration::from_secs(3600),
            ..polling_config()
        },
    )
    .await;
    outbox::submit(
        &mut *db.conn().await,
        Gated {
            key: "other".into(),
            n: 3,
        },
    )
    .await
    .unwrap();
    wait_until(
        &db.pool,
        &format!("SELECT state = 'completed' FROM ({}) AS s", state_of(3)),
        Duration::from_secs(60),
    )
    .await;

    // The key is owed a hand-over; the worker's sessions go (a failover,
    // an operator) while it waits.
    for _ in 0..3 {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name LIKE 'outbox %'",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.commit().await.unwrap();
    wait_until(
        &db.pool,
        &format!("SELECT state = 'completed' FROM ({}) AS s", state_of(2)),
        Duration::from_secs(60),
    )
    .await;
    run.running.stop().await;
    assert_eq!(
        run.counters.snapshot().keys_deferred,
        1,
        "the key was handed on after the outcome that let go of it"
    );
    assert_eq!(
        run.gate.1.lock().unwrap().clone(),
        vec![
            ("held".to_owned(), 1),
            ("other".to_owned(), 3),
            ("held".to_owned(), 2)
        ],
        "the held key's next step ran once, after the submit committed"
    );
}

/// An operator's cancel of a task waiting for its key locks the key before
/// the task. A hand-over in progress holds the key and then writes the
/// key's next task: a cancel that held that task while it waited for the
/// key deadlocked with it (PostgreSQL aborted one of them).
#[tokio::test]
async fn a_cancel_of_a_waiting_task_takes_its_key_before_the_task() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    for n in 1..=2 {
        outbox::submit(&mut conn, Gated { key: "c".into(), n })
            .await
            .unwrap();
    }
    drop(conn);
    let waiting: i64 = sqlx::query_scalar(
        "SELECT id FROM outbox_tasks WHERE (payload->>'n')::bigint = 2 AND blocked",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();

    // A hand-over's first step: the key's row.
    let mut hand_over = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM outbox_keys WHERE ordering_key = 'c' FOR UPDATE")
        .execute(&mut *hand_over)
        .await
        .unwrap();
    let pool = db.pool.clone();
    let cancel =
        tokio::spawn(async move { admin::cancel_tasks(&pool, &[outbox::TaskId(waiting)]).await });
    wait_until(
        &db.pool,
        "SELECT count(*) = 1 FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
        Duration::from_secs(60),
    )
    .await;
    // Its second: the key's next task, which the cancel must not hold.
    sqlx::query("SELECT 1 FROM outbox_tasks WHERE id = $1 FOR UPDATE NOWAIT")
        .bind(waiting)
        .execute(&mut *hand_over)
        .await
        .expect("the waiting task is not locked by the cancel waiting for its key");
    hand_over.commit().await.unwrap();
    let cancelled = cancel.await.unwrap().unwrap();
    assert_eq!(cancelled, vec![outbox::TaskId(waiting)]);
    let dead: bool =
        sqlx::query_scalar("SELECT dead_at IS NOT NULL FROM outbox_tasks WHERE id = $1")
            .bind(waiting)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(dead, "the cancel went through after the hand-over");
}

/// A worker that owes a key when it stops does not wait for the other
/// transaction to let go of it: it stops, and the maintenance leader (here
/// the next worker's first round) hands the key on once it is free.
#[tokio::test]
async fn a_worker_owing_a_key_stops_at_once_and_maintenance_hands_the_key_on() {
    let db = TestDb::migrated().await;
    let (run, app) = finish_a_step_beside_an_open_submit(
        &db,
        "owed",
        WorkerConfig {
            // Far beyond the bound checked below: the stop must not wait
            // for the flush deadline.
            flush_timeout: Duration::from_secs(600),
            ..polling_config()
        },
    )
    .await;
    let stopping = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(120), run.running.stop())
        .await
        .expect("the worker stopped without waiting for the key's lock");
    eprintln!("stopped in {:?} owing a key", stopping.elapsed());
    assert_eq!(run.counters.snapshot().keys_deferred, 1);

    app.commit().await.unwrap();
    let gate = Gate::default();
    let next = RunningWorker::start(gated_worker(&db, polling_config(), &gate, 2));
    wait_until(
        &db.pool,
        &format!("SELECT state = 'completed' FROM ({}) AS s", state_of(2)),
        Duration::from_secs(60),
    )
    .await;
    next.stop().await;
    assert_eq!(gate.1.lock().unwrap().clone(), vec![("owed".to_owned(), 2)]);
}

/// A worker whose claims take runs of up to 8 of a key's steps, polling
/// often.
fn runs_config() -> WorkerConfig {
    WorkerConfig {
        poll_interval: Duration::from_millis(200),
        key_run: 8,
        ..WorkerConfig::default()
    }
}

/// State, blocked flag and claim token of steps 2 and 3.
async fn second_and_third(db: &TestDb) -> Vec<(String, bool, Option<String>)> {
    let mut rows = Vec::new();
    for n in [2, 3] {
        rows.push(
            sqlx::query_as(sqlx::AssertSqlSafe(state_of(n)))
                .fetch_one(&db.pool)
                .await
                .unwrap(),
        );
    }
    rows
}

#[tokio::test]
async fn a_run_stops_where_its_queue_is_paused_and_its_key_goes_on_after_the_resume() {
    let db = TestDb::migrated().await;
    let run = start_gated(&db, "k", 3, 0, runs_config(), 4).await;
    // Steps 2 and 3 were claimed with step 1, as its run.
    let claimed = second_and_third(&db).await;
    assert!(
        claimed
            .iter()
            .all(|(s, blocked, by)| s == "processing" && *blocked && by.is_some()),
        "{claimed:?}"
    );
    // Paused while step 1 runs: its outcome ends the run, which goes back;
    // step 2 gets the key and waits for the resume.
    admin::pause_queue(&db.pool, "hand-on-gated").await.unwrap();
    run.gate.0.add_permits(1);
    wait_until(
        &db.pool,
        &format!(
            "SELECT s.state = 'pending' AND NOT s.blocked AND s.claimed_by IS NULL FROM ({}) AS s",
            state_of(2)
        ),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        second_and_third(&db).await,
        vec![
            ("pending".to_owned(), false, None),
            ("pending".to_owned(), true, None)
        ],
        "the run went back: step 2 holds the key, step 3 waits behind it"
    );
    assert_eq!(
        run.gate.1.lock().unwrap().len(),
        1,
        "nothing ran while paused"
    );
    admin::resume_queue(&db.pool, "hand-on-gated")
        .await
        .unwrap();
    wait_until(
        &db.pool,
        "SELECT count(*) = 3 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(30),
    )
    .await;
    run.running.stop().await;
    let started: Vec<i64> = run.gate.1.lock().unwrap().iter().map(|(_, n)| *n).collect();
    assert_eq!(started, vec![1, 2, 3]);
    assert_eq!(
        run.counters.snapshot().tasks_run_on,
        1,
        "step 3, in step 2's run"
    );
}

#[tokio::test]
async fn a_worker_stopping_mid_run_gives_the_run_back_and_another_runs_it_in_order() {
    let db = TestDb::migrated().await;
    // A loaded machine may take seconds to write step 1's outcome at
    // shutdown: past the flush deadline it would be left unwritten (and the
    // step released to run again), which is another test's subject.
    let config = WorkerConfig {
        flush_timeout: Duration::from_secs(120),
        ..runs_config()
    };
    let run = start_gated(&db, "k", 3, 0, config, 4).await;
    // Shutdown asked while step 1 runs with steps 2 and 3 claimed behind
    // it; step 1 then finishes, and its run goes back.
    let GatedRun {
        gate,
        running,
        counters,
    } = run;
    running.request_stop();
    gate.0.add_permits(1);
    running.stop().await;
    let first: (String, bool, Option<String>) = sqlx::query_as(sqlx::AssertSqlSafe(state_of(1)))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        first.0, "completed",
        "step 1's outcome was written at shutdown"
    );
    assert_eq!(counters.snapshot().tasks_run_on, 0);
    assert_eq!(
        second_and_third(&db).await,
        vec![
            ("pending".to_owned(), false, None),
            ("pending".to_owned(), true, None)
        ],
        "step 2 holds the key, step 3 waits behind it"
    );
    let again = RunningWorker::start(gated_worker(&db, runs_config(), &gate, 4));
    wait_until(
        &db.pool,
        "SELECT count(*) = 3 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(30),
    )
    .await;
    again.stop().await;
    let started: Vec<i64> = gate.1.lock().unwrap().iter().map(|(_, n)| *n).collect();
    assert_eq!(started, vec![1, 2, 3]);
}

#[tokio::test]
async fn a_task_requeued_ahead_of_a_run_waits_for_the_run_and_never_runs_beside_it() {
    let db = TestDb::migrated().await;
    // Step 7 is submitted first (its place in the key's line comes before
    // the others) and cancelled: skipped, it lets the key go on.
    let mut conn = db.conn().await;
    let first = outbox::submit(
        &mut conn,
        Gated {
            key: "k".to_owned(),
            n: 7,
        },
    )
    .await
    .unwrap();
    drop(conn);
    admin::cancel_tasks(&db.pool, &[first]).await.unwrap();
    // Steps 0, 1 (held at the gate) and 2, claimed as one run; step 1 runs.
    let mut conn = db.conn().await;
    for n in [0, 1, 2] {
        let step = Gated {
            key: "k".to_owned(),
            n,
        };
        outbox::submit(&mut conn, step).await.unwrap();
    }
    drop(conn);
    let gate = Gate::default();
    let running = RunningWorker::start(gated_worker(&db, runs_config(), &gate, 4));
    wait_until(
        &db.pool,
        &format!(
            "SELECT s.state = 'processing' AND (SELECT count(*) = 1 FROM outbox_all_tasks \
             WHERE (payload->>'n')::bigint = 0 AND state = 'completed') FROM ({}) AS s",
            state_of(1)
        ),
        Duration::from_secs(30),
    )
    .await;
    // Retried now, between two tasks of the run: it queues again, behind
    // what the run holds, and no hand-over (its own, or maintenance's) may
    // give it the key meanwhile.
    admin::retry_tasks(&db.pool, &[first]).await.unwrap();
    let advanced: i64 = sqlx::query_scalar(include_str!(
        "../../outbox-core/src/db/sql/advance_keys.sql"
    ))
    .bind(None::<String>)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(advanced, 0, "the run holds the key");
    let seventh: (String, bool, Option<String>) = sqlx::query_as(sqlx::AssertSqlSafe(state_of(7)))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        seventh,
        ("pending".to_owned(), true, None),
        "waiting in line"
    );
    gate.0.add_permits(1);
    wait_until(
        &db.pool,
        "SELECT count(*) = 4 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(30),
    )
    .await;
    running.stop().await;
    let started: Vec<i64> = gate.1.lock().unwrap().iter().map(|(_, n)| *n).collect();
    assert_eq!(started, vec![0, 1, 2, 7]);
}
