//! Cancelling a running task: the worker holding it is told (NOTIFY, or its
//! heartbeat without one), fires the task's token, and the task ends dead
//! "cancelled by an operator", never retried, whatever the handler returns.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, TaskId, Worker, WorkerConfig,
    admin, outbox_task,
};
use outbox_tests::process::{wait_for_condition, wait_until};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.cancel.long", queue = "cancel-tests")]
struct Long {
    /// Whether the handler watches its token.
    polite: bool,
    /// Whether the handler asks to run again later instead of succeeding
    /// (an outcome written by the general statement, not the fast path).
    #[serde(default)]
    snooze: bool,
}

#[derive(Clone)]
struct Worked {
    /// Set when the handler starts: a claimed task may still wait in the
    /// worker's buffer, and a cancel that reaches it there never runs it.
    started: Arc<AtomicBool>,
    saw_token: Arc<AtomicBool>,
    /// Set when the token of a handler that ignores it fires: the worker
    /// heard the cancel.
    heard: Arc<AtomicBool>,
    /// Opened by the test once the cancel is in: a handler that ignores its
    /// token runs until then, however slow the machine.
    gate: Arc<tokio::sync::Semaphore>,
    /// Handlers started of tasks behind a run's head.
    behind: Arc<AtomicUsize>,
}

impl Default for Worked {
    fn default() -> Self {
        Self {
            started: Arc::default(),
            saw_token: Arc::default(),
            heard: Arc::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            behind: Arc::default(),
        }
    }
}

impl TaskHandler<Long> for Worked {
    async fn handle(&self, ctx: TaskContext, task: Long) -> HandlerResult {
        self.started.store(true, Ordering::SeqCst);
        if task.polite {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(120)) => {}
                () = ctx.cancellation().cancelled() => self.saw_token.store(true, Ordering::SeqCst),
            }
        } else {
            // Ignores the token (only notes that it fired), then claims
            // success.
            let (token, heard) = (ctx.cancellation().clone(), Arc::clone(&self.heard));
            tokio::spawn(async move {
                token.cancelled().await;
                heard.store(true, Ordering::SeqCst);
            });
            let _open = self.gate.acquire().await;
        }
        if task.snooze {
            return Ok(Outcome::RetryAfter(Duration::from_secs(1)));
        }
        Ok(Outcome::Success)
    }
}

/// Runs one task until it is PROCESSING, cancels it, and waits for it to be
/// dead; returns the row, whether the handler saw its token, and how long
/// from the cancel call to the dead row.
async fn cancel_running(polite: bool, config: WorkerConfig) -> (admin::TaskRecord, bool, Duration) {
    let db = TestDb::migrated().await;
    let id = outbox::submit(
        &mut *db.conn().await,
        Long {
            polite,
            snooze: false,
        },
    )
    .await
    .unwrap();
    let worked = Worked::default();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(config)
            .handler::<Long>(worked.clone())
            .build()
            .unwrap(),
    );
    wait_until(
        &db.pool,
        &format!("SELECT state = 'processing' FROM outbox_all_tasks WHERE id = {id}"),
        Duration::from_secs(20),
    )
    .await;
    wait_started(&worked).await;
    let asked = Instant::now();
    assert_eq!(
        admin::cancel_tasks(&db.pool, &[id]).await.unwrap(),
        vec![id]
    );
    if !polite {
        // The handler claims success only once the worker has heard.
        wait_for_condition(
            "the worker to hear the cancel",
            Duration::from_secs(20),
            || worked.heard.load(Ordering::SeqCst),
        )
        .await;
    }
    worked.gate.add_permits(1);
    worker
        .wait_for(TaskEventKind::Dead, 1, Duration::from_secs(20))
        .await;
    let took = asked.elapsed();
    worker.stop().await;
    let row = admin::get_task(&db.pool, id).await.unwrap().unwrap();
    (row, worked.saw_token.load(Ordering::SeqCst), took)
}

/// Waits until the handler has started (not only been claimed).
async fn wait_started(worked: &Worked) {
    wait_for_condition("the handler to start", Duration::from_secs(30), || {
        worked.started.load(Ordering::SeqCst)
    })
    .await;
}

fn assert_cancelled(row: &admin::TaskRecord) {
    assert_eq!(row.state, "dead", "{row:?}");
    assert_eq!(row.last_error.as_deref(), Some("cancelled by an operator"));
    assert!(row.claimed_by.is_none());
}

#[tokio::test]
async fn a_running_task_is_cancelled_through_notify_and_never_retried() {
    // The heartbeat, the other way a cancel arrives, comes every two
    // minutes: only NOTIFY delivers it within the 20 s the test waits.
    let config = WorkerConfig {
        heartbeat_interval: Duration::from_secs(120),
        ..WorkerConfig::default()
    };
    let (row, saw_token, took) = cancel_running(true, config).await;
    eprintln!("cancel with NOTIFY: {took:?} from the cancel call to the dead row");
    assert_cancelled(&row);
    assert!(saw_token, "the handler's token fired");
}

#[tokio::test]
async fn without_notify_the_heartbeat_delivers_the_cancel() {
    let config = WorkerConfig {
        listen: false,
        heartbeat_interval: Duration::from_millis(300),
        ..WorkerConfig::default()
    };
    let (row, saw_token, took) = cancel_running(true, config).await;
    eprintln!("cancel through the heartbeat (interval 300 ms): {took:?}");
    assert_cancelled(&row);
    assert!(saw_token);
}

#[tokio::test]
async fn a_handler_that_ignores_the_cancel_and_succeeds_still_ends_cancelled() {
    let (row, saw_token, _) = cancel_running(false, WorkerConfig::default()).await;
    assert_cancelled(&row);
    assert!(!saw_token);
}

#[tokio::test]
async fn a_cancel_the_worker_never_heard_of_is_applied_by_the_database() {
    for (delete_completed, snooze) in [(false, false), (true, false), (false, true)] {
        never_heard_of(delete_completed, snooze).await;
    }
}

/// The worker is not told at all (no LISTEN, a heartbeat far away): the
/// outcome it writes meets the request in the database, whether successes
/// are kept or deleted at once, or the handler asks to run again later.
async fn never_heard_of(delete_completed: bool, snooze: bool) {
    let db = TestDb::migrated().await;
    let id: TaskId = outbox::submit(
        &mut *db.conn().await,
        Long {
            polite: false,
            snooze,
        },
    )
    .await
    .unwrap();
    let config = WorkerConfig {
        listen: false,
        heartbeat_interval: Duration::from_secs(60),
        delete_completed,
        ..WorkerConfig::default()
    };
    let worked = Worked::default();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(config)
            .handler::<Long>(worked.clone())
            .build()
            .unwrap(),
    );
    wait_until(
        &db.pool,
        &format!("SELECT state = 'processing' FROM outbox_all_tasks WHERE id = {id}"),
        Duration::from_secs(20),
    )
    .await;
    wait_started(&worked).await;
    assert_eq!(
        admin::cancel_tasks(&db.pool, &[id]).await.unwrap(),
        vec![id]
    );
    worked.gate.add_permits(1);
    // The worker reports what the database wrote, not what the handler
    // returned.
    let seen = worker
        .wait_for(TaskEventKind::Dead, 1, Duration::from_secs(20))
        .await;
    worker.stop().await;
    let kinds: Vec<_> = seen.iter().map(|e| (e.id, e.kind)).collect();
    assert_eq!(kinds, [(id, TaskEventKind::Dead)]);
    let row = admin::get_task(&db.pool, id).await.unwrap().unwrap();
    assert_cancelled(&row);
    // The attempt the cancel stopped counts, as when the worker hears of it.
    assert_eq!(row.retry_count, 1, "{row:?}");
    // Retried by an operator, it runs again (the request is cleared).
    assert_eq!(admin::retry_tasks(&db.pool, &[id]).await.unwrap(), vec![id]);
    let row = admin::get_task(&db.pool, id).await.unwrap().unwrap();
    assert_eq!(row.state, "pending");
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(
    task_type = "test.cancel.in_run",
    queue = "cancel-runs",
    ordering_key = "key"
)]
struct InRun {
    key: String,
    /// The first of the key's tasks waits for the test's gate.
    first: bool,
}

impl TaskHandler<InRun> for Worked {
    async fn handle(&self, _ctx: TaskContext, task: InRun) -> HandlerResult {
        if task.first {
            self.started.store(true, Ordering::SeqCst);
            let _open = self.gate.acquire().await;
        } else {
            self.behind.fetch_add(1, Ordering::SeqCst);
        }
        Ok(Outcome::Success)
    }
}

/// Submits `n` tasks of key "k", the first of which waits for the gate;
/// a worker claims them as one run.
async fn submit_run(db: &TestDb, n: usize) -> Vec<TaskId> {
    let mut batch = outbox::Batch::new();
    for i in 0..n {
        batch
            .push(&InRun {
                key: "k".to_owned(),
                first: i == 0,
            })
            .unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap()
}

/// A run (the key's head and the tasks claimed behind it) whose head an
/// operator cancels without the worker hearing: the head ends dead and the
/// rest of the run goes back, as when the worker hears of it, and is
/// claimed again (the cancelled head lets the key go on).
#[tokio::test]
async fn a_cancel_the_worker_never_heard_of_ends_its_run() {
    let db = TestDb::migrated().await;
    let ids = submit_run(&db, 3).await;
    let worked = Worked::default();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(WorkerConfig {
                listen: false,
                heartbeat_interval: Duration::from_secs(60),
                maintenance: false,
                ..WorkerConfig::default()
            })
            .handler::<InRun>(worked.clone())
            .build()
            .unwrap(),
    );
    // The head runs, the two behind it claimed with it.
    wait_until(
        &db.pool,
        "SELECT count(*) = 3 FROM outbox_all_tasks WHERE state = 'processing'",
        Duration::from_secs(20),
    )
    .await;
    wait_started(&worked).await;
    assert_eq!(
        admin::cancel_tasks(&db.pool, &ids[..1]).await.unwrap(),
        ids[..1].to_vec()
    );
    worked.gate.add_permits(1);
    let seen = worker
        .wait_for_all(
            &[(TaskEventKind::Dead, 1), (TaskEventKind::Completed, 2)],
            Duration::from_secs(30),
        )
        .await;
    worker.stop().await;
    assert!(
        seen.iter()
            .all(|e| (e.id == ids[0]) == (e.kind == TaskEventKind::Dead)),
        "{seen:?}"
    );
    assert_cancelled(&admin::get_task(&db.pool, ids[0]).await.unwrap().unwrap());
    // Given back and claimed again, not run on. The second task was held
    // in place without a write by the first claim (migration 56: a claim
    // it never started is not counted), then claimed as the second run's
    // head; the third was both runs' last. Run on, they would have counted
    // one claim each.
    let rest: Vec<(String, i32)> = sqlx::query_as(
        "SELECT state::text, claims FROM outbox_all_tasks WHERE id = ANY($1) ORDER BY key_seq",
    )
    .bind(ids[1..].iter().map(|id| id.0).collect::<Vec<_>>())
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        rest,
        [("completed".to_owned(), 1), ("completed".to_owned(), 2)]
    );
}

/// A task claimed behind its run's head and cancelled before its turn never
/// starts its handler: it ends cancelled when its turn comes, and the head
/// completes.
#[tokio::test]
async fn a_task_cancelled_before_it_starts_never_runs() {
    let db = TestDb::migrated().await;
    let ids = submit_run(&db, 2).await;
    // A task of another type, running beside the run, cancelled after the
    // waiting one: the worker hears of the two in that order, so once the
    // sentinel's token fires it knows of both.
    let sentinel = outbox::submit(
        &mut *db.conn().await,
        Long {
            polite: false,
            snooze: false,
        },
    )
    .await
    .unwrap();
    let (runs, watch) = (Worked::default(), Worked::default());
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(WorkerConfig {
                maintenance: false,
                ..WorkerConfig::default()
            })
            .handler::<InRun>(runs.clone())
            .handler::<Long>(watch.clone())
            .build()
            .unwrap(),
    );
    wait_until(
        &db.pool,
        "SELECT count(*) = 3 FROM outbox_all_tasks WHERE state = 'processing'",
        Duration::from_secs(20),
    )
    .await;
    wait_started(&runs).await;
    wait_started(&watch).await;
    assert_eq!(
        admin::cancel_tasks(&db.pool, &ids[1..]).await.unwrap(),
        ids[1..].to_vec()
    );
    assert_eq!(
        admin::cancel_tasks(&db.pool, &[sentinel]).await.unwrap(),
        [sentinel]
    );
    wait_for_condition(
        "the worker to hear both cancels",
        Duration::from_secs(30),
        || watch.heard.load(Ordering::SeqCst),
    )
    .await;
    runs.gate.add_permits(1);
    watch.gate.add_permits(1);
    worker
        .wait_for_all(
            &[(TaskEventKind::Completed, 1), (TaskEventKind::Dead, 2)],
            Duration::from_secs(30),
        )
        .await;
    worker.stop().await;
    assert_eq!(runs.behind.load(Ordering::SeqCst), 0, "its handler ran");
    assert_cancelled(&admin::get_task(&db.pool, ids[1]).await.unwrap().unwrap());
    // Dead, it is out of its key's line (it waited in it, blocked, as a
    // task of the run).
    let blocked: bool = sqlx::query_scalar("SELECT blocked FROM outbox_tasks WHERE id = $1")
        .bind(ids[1].0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(!blocked);
    assert_cancelled(&admin::get_task(&db.pool, sentinel).await.unwrap().unwrap());
    let head = admin::get_task(&db.pool, ids[0]).await.unwrap().unwrap();
    assert_eq!(head.state, "completed", "{head:?}");
}

/// A task of a run cancelled without the worker hearing of it runs and
/// succeeds; its outcome meets the request: it ends dead, its attempt
/// counted, and out of its key's line (it waited in it as a task of the
/// run), as any dead task is.
#[tokio::test]
async fn a_task_of_a_run_cancelled_unheard_ends_dead_out_of_its_line() {
    let db = TestDb::migrated().await;
    let ids = submit_run(&db, 2).await;
    let runs = Worked::default();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(WorkerConfig {
                listen: false,
                heartbeat_interval: Duration::from_secs(60),
                maintenance: false,
                ..WorkerConfig::default()
            })
            .handler::<InRun>(runs.clone())
            .build()
            .unwrap(),
    );
    wait_until(
        &db.pool,
        "SELECT count(*) = 2 FROM outbox_all_tasks WHERE state = 'processing'",
        Duration::from_secs(20),
    )
    .await;
    wait_started(&runs).await;
    assert_eq!(
        admin::cancel_tasks(&db.pool, &ids[1..]).await.unwrap(),
        ids[1..].to_vec()
    );
    runs.gate.add_permits(1);
    worker
        .wait_for_all(
            &[(TaskEventKind::Completed, 1), (TaskEventKind::Dead, 1)],
            Duration::from_secs(30),
        )
        .await;
    worker.stop().await;
    assert_eq!(runs.behind.load(Ordering::SeqCst), 1, "not told, it ran");
    let row = admin::get_task(&db.pool, ids[1]).await.unwrap().unwrap();
    assert_cancelled(&row);
    assert_eq!((row.retry_count, row.blocked), (1, false), "{row:?}");
}

/// Starts a cancel of `id` while `tx` holds the task's row (or its row in
/// the intake), waits until the
/// cancel waits for it, commits `tx`, and returns what the cancel
/// returned.
async fn cancel_across(
    db: &TestDb,
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    id: TaskId,
) -> Vec<TaskId> {
    let cancel = tokio::spawn({
        let pool = db.pool.clone();
        async move { admin::cancel_tasks(&pool, &[id]).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let sessions: Vec<(Option<String>, Option<String>, String)> = sqlx::query_as(
            "SELECT wait_event_type, wait_event, left(query, 60) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap();
        // It waits either for the task's row or, for a task a claim is
        // moving from the intake, for that move.
        if sessions.iter().any(|(kind, _, query)| {
            kind.as_deref() == Some("Lock")
                && (query.contains("operator cancel") || query.contains("outbox_take_intake_ids"))
        }) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline && !cancel.is_finished(),
            "the cancel never waited for the task: {sessions:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.commit().await.unwrap();
    cancel.await.unwrap().unwrap()
}

/// A cancel that waits for a task's row while another transaction changes
/// the task's state, then commits, cancels the task by the state it then
/// has: one just claimed is asked to stop, one just failed (waiting for its
/// retry) ends dead. The cancel's updates used to judge the task by its
/// state before the wait, none of them matched it, and the cancel was lost.
#[tokio::test]
async fn a_cancel_racing_a_change_of_state_is_not_lost() {
    let db = TestDb::migrated().await;
    let task = Long {
        polite: true,
        snooze: false,
    };
    // Claimed while the cancel waits: once in outbox_tasks, and once as the
    // claim moves it there from the intake (where its submit wrote it).
    for from_intake in [false, true] {
        let claimed = outbox::submit(&mut *db.conn().await, task.clone())
            .await
            .unwrap();
        if !from_intake {
            db.take_intake().await;
        }
        let mut tx = db.pool.begin().await.unwrap();
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM outbox_claim_tasks('cancel-tests', 10, 'test-token', NULL, \
             -1::smallint, NULL, NULL, NULL, NULL, 1, 0)",
        )
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        assert_eq!(ids, [claimed.0]);
        assert_eq!(cancel_across(&db, tx, claimed).await, [claimed]);
        let (state, asked): (String, bool) = sqlx::query_as(
            "SELECT state::text, cancel_requested_at IS NOT NULL FROM outbox_tasks \
             WHERE id = $1",
        )
        .bind(claimed.0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(
            (state.as_str(), asked),
            ("processing", true),
            "{from_intake}"
        );
    }

    // Running when the cancel began; failed, waiting for a retry, when it
    // got the row.
    let failed = outbox::submit(&mut *db.conn().await, task).await.unwrap();
    db.take_intake().await;
    sqlx::query(
        "UPDATE outbox_tasks SET state = 'processing', claimed_by = 'other-token', \
         claims = claims + 1, attempted_at = now() WHERE id = $1",
    )
    .bind(failed.0)
    .execute(&db.pool)
    .await
    .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query(
        "UPDATE outbox_tasks SET state = 'failed', claimed_by = NULL, retry_count = 1, \
         execute_at = now() + interval '1 hour' WHERE id = $1",
    )
    .bind(failed.0)
    .execute(&mut *tx)
    .await
    .unwrap();
    assert_eq!(cancel_across(&db, tx, failed).await, [failed]);
    assert_cancelled(&admin::get_task(&db.pool, failed).await.unwrap().unwrap());
}

/// A cancel that loses a deadlock to the engine runs again instead of
/// failing. The cancel locks a waiting task's key, then the tasks; stuck-task
/// recovery locks a running task, then its key. A batch with both tasks of
/// one key can deadlock with it, and PostgreSQL aborts one of the two.
#[tokio::test]
async fn a_cancel_that_loses_a_deadlock_runs_again() {
    let db = TestDb::migrated().await;
    let ids = submit_run(&db, 2).await;
    // The head runs; the task behind it waits for the key.
    sqlx::query(
        "UPDATE outbox_tasks SET state = 'processing', claimed_by = 'test', claims = 1 \
         WHERE id = $1",
    )
    .bind(ids[0].0)
    .execute(&db.pool)
    .await
    .unwrap();
    // As recovery does: the running task first. This session looks for
    // deadlocks late, so the cancel is the one PostgreSQL aborts.
    let mut recovery = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL deadlock_timeout = '30s'")
        .execute(&mut *recovery)
        .await
        .unwrap();
    sqlx::query("SELECT 1 FROM outbox_tasks WHERE id = $1 FOR UPDATE")
        .bind(ids[0].0)
        .execute(&mut *recovery)
        .await
        .unwrap();
    let cancel = tokio::spawn({
        let (pool, ids) = (db.pool.clone(), ids.clone());
        async move { admin::cancel_tasks(&pool, &ids).await }
    });
    wait_until(
        &db.pool,
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
                        AND wait_event_type = 'Lock' \
                        AND query LIKE '%first statement of an operator cancel%')",
        Duration::from_secs(30),
    )
    .await;
    // Then its key, which the cancel holds: a deadlock.
    sqlx::query(
        "SELECT 1 FROM outbox_keys WHERE queue = 'cancel-runs' AND ordering_key = 'k' FOR UPDATE",
    )
    .execute(&mut *recovery)
    .await
    .unwrap();
    recovery.commit().await.unwrap();
    let mut cancelled = cancel.await.unwrap().expect("the cancel runs again");
    cancelled.sort();
    assert_eq!(cancelled, ids);
}
