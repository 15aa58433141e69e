//! Durable steps inside one handler: a retried attempt skips what
//! succeeded, and a durable sleep frees the worker's slot, counts no
//! attempt and wakes the task at its recorded time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    HandlerError, HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, Worker,
    WorkerConfig, outbox_task,
};
use outbox_tests::process::wait_until;
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.durable.order", queue = "durable", retry_delays = ["10ms", "10ms", "10ms"])]
struct Order {
    label: String,
    /// Sleep this long (ms) between the two steps.
    nap_ms: u64,
}

#[derive(Default, Clone)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, entry: String) {
        self.0.lock().unwrap().push(entry);
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

#[derive(Clone)]
struct Handler(Log);

impl TaskHandler<Order> for Handler {
    async fn handle(&self, ctx: TaskContext, task: Order) -> HandlerResult {
        let log = self.0.clone();
        let label = task.label.clone();
        let charged: u64 = ctx
            .step("charge", || async {
                log.push(format!("{label}:charge"));
                Ok::<_, HandlerError>(4200)
            })
            .await?;
        if task.nap_ms > 0 {
            ctx.sleep("nap", Duration::from_millis(task.nap_ms)).await?;
        }
        let attempt = ctx.attempt();
        let shipped: String = ctx
            .step("ship", || async {
                log.push(format!("{label}:ship"));
                if label == "flaky" && attempt == 1 {
                    return Err(HandlerError::msg("the carrier is down"));
                }
                Ok(format!("parcel for {charged}"))
            })
            .await?;
        log.push(format!("{label}:done"));
        Outcome::success_with(&shipped)
    }
}

fn worker(db: &TestDb, log: &Log, concurrency: usize) -> RunningWorker {
    RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(WorkerConfig {
                maintenance_interval: Duration::from_millis(100),
                cleanup_interval: Duration::from_millis(100),
                ..WorkerConfig::default()
            })
            .handler::<Order>(Handler(log.clone()))
            .queue("durable", concurrency)
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn a_retried_attempt_skips_the_steps_that_succeeded() {
    let db = TestDb::migrated().await;
    let id = outbox::submit(
        &mut *db.conn().await,
        Order {
            label: "flaky".into(),
            nap_ms: 0,
        },
    )
    .await
    .unwrap();
    let log = Log::default();
    let mut w = worker(&db, &log, 2);
    w.wait_for(TaskEventKind::Completed, 1, Duration::from_secs(30))
        .await;
    // Its records go once the task has left outbox_tasks.
    wait_until(
        &db.pool,
        "SELECT NOT EXISTS (SELECT 1 FROM outbox_durable_steps)",
        Duration::from_secs(60),
    )
    .await;
    w.stop().await;
    assert_eq!(
        log.all(),
        ["flaky:charge", "flaky:ship", "flaky:ship", "flaky:done"],
        "the charge ran once; the failed ship ran again"
    );
    let result: Option<String> = outbox::result(&mut *db.conn().await, id).await.unwrap();
    assert_eq!(result.as_deref(), Some("parcel for 4200"));
    let record = outbox::admin::get_task(&db.pool, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.retry_count, 1);
}

#[tokio::test]
async fn a_durable_sleep_frees_the_slot_counts_no_attempt_and_wakes_after_its_time() {
    let db = TestDb::migrated().await;
    let sleeper = outbox::submit(
        &mut *db.conn().await,
        Order {
            label: "sleeper".into(),
            nap_ms: 5000,
        },
    )
    .await
    .unwrap();
    let log = Log::default();
    // One slot: the second task can only run while the first sleeps (if
    // the sleep held the slot, it would run after the sleeper, 5 s on).
    let mut w = worker(&db, &log, 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !log.all().contains(&"sleeper:charge".to_owned()) {
        assert!(tokio::time::Instant::now() < deadline, "never charged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    outbox::submit(
        &mut *db.conn().await,
        Order {
            label: "quick".into(),
            nap_ms: 0,
        },
    )
    .await
    .unwrap();
    w.wait_for(TaskEventKind::Completed, 2, Duration::from_secs(60))
        .await;
    w.stop().await;
    assert_eq!(
        log.all(),
        [
            "sleeper:charge",
            "quick:charge",
            "quick:ship",
            "quick:done",
            "sleeper:ship",
            "sleeper:done"
        ]
    );
    let (retries, slept): (i32, f64) = sqlx::query_as(
        "SELECT retry_count, extract(epoch FROM finished_at - created_at)::float8 \
         FROM outbox_all_tasks WHERE id = $1",
    )
    .bind(sleeper.0)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(retries, 0, "a sleep is not a failed attempt");
    assert!(slept >= 5.0, "woke after {slept} s");
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.durable.bad", queue = "durable-bad", retry_delays = ["1h"])]
struct Bad {
    name: String,
}

struct BadHandler;

impl TaskHandler<Bad> for BadHandler {
    async fn handle(&self, ctx: TaskContext, task: Bad) -> HandlerResult {
        // Recorded as a number, read back as text.
        let _: u32 = ctx.step("n", || async { Ok::<_, HandlerError>(7) }).await?;
        let _: String = ctx
            .step(&task.name, || async {
                Ok::<_, HandlerError>("x".to_owned())
            })
            .await?;
        Ok(Outcome::Success)
    }
}

#[tokio::test]
async fn a_bad_step_name_or_a_record_of_another_type_fails_the_attempt_clearly() {
    let db = TestDb::migrated().await;
    let empty = outbox::submit(
        &mut *db.conn().await,
        Bad {
            name: String::new(),
        },
    )
    .await
    .unwrap();
    let retyped = outbox::submit(&mut *db.conn().await, Bad { name: "n".into() })
        .await
        .unwrap();
    let mut w = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Bad>(BadHandler)
            .build()
            .unwrap(),
    );
    w.wait_for(TaskEventKind::Dead, 2, Duration::from_secs(30))
        .await;
    w.stop().await;
    let error = |id| {
        let pool = db.pool.clone();
        async move {
            outbox::admin::get_task(&pool, id)
                .await
                .unwrap()
                .unwrap()
                .last_error
                .unwrap()
        }
    };
    assert!(
        error(empty).await.contains("must be 1 to 200 bytes"),
        "{}",
        error(empty).await
    );
    let e = error(retyped).await;
    assert!(
        e.contains("durable step \"n\"") && e.contains("does not decode"),
        "{e}"
    );
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.durable.approval", queue = "approvals", retry_delays = ["1h"])]
struct NeedsApproval {
    label: String,
    /// Give up after this many ms without a signal (0: wait for ever).
    within_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Approval {
    by: String,
}

#[derive(Clone)]
struct Approver(Log);

impl TaskHandler<NeedsApproval> for Approver {
    async fn handle(&self, ctx: TaskContext, task: NeedsApproval) -> HandlerResult {
        let log = self.0.clone();
        let label = task.label.clone();
        ctx.step("ask", || async {
            log.push(format!("{label}:ask"));
            Ok::<_, HandlerError>(())
        })
        .await?;
        let approval: Option<Approval> = if task.within_ms == 0 {
            Some(ctx.wait_for("approved").await?)
        } else {
            ctx.wait_for_within("approved", Duration::from_millis(task.within_ms))
                .await?
        };
        let by = approval.map_or_else(|| "nobody".to_owned(), |a| a.by);
        self.0.push(format!("{}:approved by {by}", task.label));
        Outcome::success_with(&by)
    }
}

fn approvals_worker(db: &TestDb, log: &Log) -> RunningWorker {
    RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<NeedsApproval>(Approver(log.clone()))
            .queue("approvals", 1)
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn a_waiting_task_frees_its_slot_and_only_a_committed_signal_wakes_it() {
    let db = TestDb::migrated().await;
    let waiting = outbox::submit(
        &mut *db.conn().await,
        NeedsApproval {
            label: "order".into(),
            within_ms: 0,
        },
    )
    .await
    .unwrap();
    let log = Log::default();
    let mut w = approvals_worker(&db, &log);
    // Suspended: pending again, due only at the recheck.
    wait_until(
        &db.pool,
        &format!(
            "SELECT state = 'pending' AND execute_at > now() + interval '10 seconds' \
             FROM outbox_all_tasks WHERE id = {waiting}"
        ),
        Duration::from_secs(30),
    )
    .await;
    // Its slot is free: another task runs (and gives up waiting).
    outbox::submit(
        &mut *db.conn().await,
        NeedsApproval {
            label: "other".into(),
            within_ms: 1,
        },
    )
    .await
    .unwrap();
    w.wait_for(TaskEventKind::Completed, 1, Duration::from_secs(30))
        .await;

    // A signal in a transaction that rolls back wakes nothing.
    let mut tx = db.pool.begin().await.unwrap();
    let approval = Approval { by: "ada".into() };
    assert!(
        outbox::signal(&mut tx, waiting, "approved", &approval)
            .await
            .unwrap()
    );
    tx.rollback().await.unwrap();
    let still: bool =
        sqlx::query_scalar("SELECT execute_at > now() FROM outbox_tasks WHERE id = $1")
            .bind(waiting.0)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(still, "a rolled-back signal woke the task");

    // A committed one does, well before the recheck. The first signal of
    // a name wins.
    let mut tx = db.pool.begin().await.unwrap();
    assert!(
        outbox::signal(&mut tx, waiting, "approved", &approval)
            .await
            .unwrap()
    );
    let again = Approval { by: "bob".into() };
    assert!(
        !outbox::signal(&mut tx, waiting, "approved", &again)
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    w.wait_for(TaskEventKind::Completed, 1, Duration::from_secs(30))
        .await;
    w.stop().await;
    let by: Option<String> = outbox::result(&mut *db.conn().await, waiting)
        .await
        .unwrap();
    assert_eq!(by.as_deref(), Some("ada"));
    // A finished task takes no signal: nothing would read it (and
    // maintenance deletes the signals of tasks that left).
    assert!(
        !outbox::signal(&mut *db.conn().await, waiting, "later", &again)
            .await
            .unwrap()
    );
    let entries = log.all();
    assert_eq!(
        entries.iter().filter(|e| *e == "order:ask").count(),
        1,
        "{entries:?}"
    );
    assert!(
        entries.contains(&"other:approved by nobody".to_owned()),
        "{entries:?}"
    );
    let retries: i32 = sqlx::query_scalar("SELECT retry_count FROM outbox_all_tasks WHERE id = $1")
        .bind(waiting.0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(retries, 0, "waiting is not a failed attempt");
    // A task that never ran keeps its run-at: a signal waits for it.
    let scheduled = outbox::submit_with(
        &mut *db.conn().await,
        NeedsApproval {
            label: "tomorrow".into(),
            within_ms: 0,
        },
        outbox::TaskOptions::new().delay(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    assert!(
        outbox::signal(&mut *db.conn().await, scheduled, "approved", &approval)
            .await
            .unwrap()
    );
    let due_later: bool = sqlx::query_scalar(
        "SELECT execute_at > now() + interval '30 minutes' FROM outbox_tasks WHERE id = $1",
    )
    .bind(scheduled.0)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(due_later, "a signal made a scheduled task due");
    let bad = outbox::signal(&mut *db.conn().await, waiting, "", &approval).await;
    assert!(
        matches!(&bad, Err(outbox::Error::InvalidOption(m)) if m.contains("1 to 200 bytes")),
        "{bad:?}"
    );
}
