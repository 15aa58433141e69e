//! A workflow's step that finishes its work after an operator's cancel is
//! recorded as completed, so that its saga compensates it (migration 48):
//! ended dead, a charge made before the handler saw its token was never
//! refunded.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::workflow::workflow_status;
use outbox::{
    HandlerResult, Outcome, TaskContext, TaskHandler, TaskId, Worker, WorkerConfig, Workflow,
    WorkflowId, outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};

use crate::workflows::{pairs, step_states, task_of, wait_state};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

/// A step's work: `charge` waits (for its cancellation token, or for the
/// test's permit) and then succeeds all the same; the others succeed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.wfcancel.step", queue = "wf-cancel", retry_delays = ["1h"])]
struct Step {
    label: String,
}

fn step(label: &str) -> Step {
    Step {
        label: label.to_owned(),
    }
}

struct Shared {
    /// Labels in the order their attempts started.
    log: Mutex<Vec<String>>,
    /// One permit per charge attempt, given when it started.
    started: Semaphore,
    /// A charge that waits for the test (not its token) takes one, and so
    /// does the task ahead of a keyed charge.
    go: Semaphore,
    /// One permit when the task ahead of a keyed charge started.
    ahead_started: Semaphore,
    wait_for_token: bool,
}

impl Shared {
    fn new(wait_for_token: bool) -> Arc<Self> {
        Arc::new(Self {
            log: Mutex::default(),
            started: Semaphore::new(0),
            go: Semaphore::new(0),
            ahead_started: Semaphore::new(0),
            wait_for_token,
        })
    }
}

#[derive(Clone)]
struct Handler(Arc<Shared>);

impl TaskHandler<Step> for Handler {
    async fn handle(&self, ctx: TaskContext, task: Step) -> HandlerResult {
        self.0.log.lock().unwrap().push(task.label.clone());
        // A task ahead of the charge on its ordering key: waits for the test.
        if task.label == "ahead" {
            self.0.ahead_started.add_permits(1);
            self.0.go.acquire().await.unwrap().forget();
        }
        if task.label == "charge" {
            self.0.started.add_permits(1);
            if self.0.wait_for_token {
                // Sees the cancel, and finishes its work regardless.
                ctx.cancellation().cancelled().await;
            } else {
                self.0.go.acquire().await.unwrap().forget();
            }
        }
        Ok(Outcome::Success)
    }
}

fn checkout() -> Workflow {
    let mut w = Workflow::new("checkout");
    w.add("charge", &step("charge"))
        .unwrap()
        .compensate("charge", &step("refund"))
        .unwrap()
        .add_after("ship", &["charge"], &step("ship"))
        .unwrap();
    w
}

async fn submit(db: &TestDb) -> WorkflowId {
    submit_workflow(db, checkout()).await
}

async fn submit_workflow(db: &TestDb, workflow: Workflow) -> WorkflowId {
    let mut tx = db.pool.begin().await.unwrap();
    let id = workflow.submit(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    id
}

/// Cancels workflow `id` once its charge runs; returns (steps, tasks)
/// cancelled.
async fn cancel_during_charge(db: &TestDb, shared: &Shared, id: WorkflowId) -> (i64, i64) {
    shared.started.acquire().await.unwrap().forget();
    let report = outbox::workflow::cancel(&db.pool, id)
        .await
        .unwrap()
        .unwrap();
    (report.steps_cancelled, report.tasks_cancelled)
}

fn start(db: &TestDb, shared: &Arc<Shared>, listen: bool) -> RunningWorker {
    let config = WorkerConfig {
        listen,
        // Not heard of through a heartbeat either, where the test says so.
        heartbeat_interval: Duration::from_secs(if listen { 1 } else { 60 }),
        ..WorkerConfig::default()
    };
    RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(config)
            .handler::<Step>(Handler(shared.clone()))
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn a_cancelled_sagas_step_that_finishes_its_work_anyway_is_compensated() {
    let db = TestDb::migrated().await;
    let shared = Shared::new(true);
    let id = submit(&db).await;
    let worker = start(&db, &shared, true);
    shared.started.acquire().await.unwrap().forget();
    let report = outbox::workflow::cancel(&db.pool, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((report.steps_cancelled, report.tasks_cancelled), (1, 1));
    let status = wait_state(&db.pool, id, "compensated").await;
    worker.stop().await;
    assert_eq!(
        step_states(&status),
        pairs(&[
            ("charge", "completed"),
            ("ship", "cancelled"),
            ("undo:charge", "completed"),
        ])
    );
    assert_eq!(*shared.log.lock().unwrap(), ["charge", "refund"]);
}

/// The worker never hears of the cancel (no LISTEN, its heartbeat a minute
/// away): the database, meeting the success, records it as one too, and
/// the workflow goes on.
#[tokio::test]
async fn a_step_whose_cancel_the_worker_never_heard_of_completes_when_it_succeeds() {
    let db = TestDb::migrated().await;
    let shared = Shared::new(false);
    let id = submit(&db).await;
    let mut worker = start(&db, &shared, false);
    shared.started.acquire().await.unwrap().forget();
    let status = workflow_status(&db.pool, id).await.unwrap().unwrap();
    let charge: TaskId = task_of(&status, "charge");
    assert_eq!(
        outbox::admin::cancel_tasks(&db.pool, &[charge])
            .await
            .unwrap(),
        [charge]
    );
    shared.go.add_permits(1);
    let status = wait_state(&db.pool, id, "completed").await;
    worker
        .wait_for(outbox::TaskEventKind::Completed, 2, Duration::from_secs(30))
        .await;
    worker.stop().await;
    assert_eq!(
        step_states(&status),
        pairs(&[("charge", "completed"), ("ship", "completed")])
    );
    assert_eq!(*shared.log.lock().unwrap(), ["charge", "ship"]);
}

/// A cancel that comes during a saga's last step stops nothing waiting;
/// the step succeeds all the same, and the saga is undone, that step
/// included: the cancel asked for the undo. (It ended `completed` with
/// nothing undone once the step's success counted.)
#[tokio::test]
async fn a_saga_cancelled_during_its_last_step_is_undone_when_the_step_succeeds() {
    let db = TestDb::migrated().await;
    let shared = Shared::new(true);
    let mut w = Workflow::new("charge-only");
    w.add("charge", &step("charge"))
        .unwrap()
        .compensate("charge", &step("refund"))
        .unwrap();
    let id = submit_workflow(&db, w).await;
    let worker = start(&db, &shared, true);
    assert_eq!(cancel_during_charge(&db, &shared, id).await, (0, 1));
    let status = wait_state(&db.pool, id, "compensated").await;
    worker.stop().await;
    assert_eq!(
        step_states(&status),
        pairs(&[("charge", "completed"), ("undo:charge", "completed")])
    );
    assert_eq!(*shared.log.lock().unwrap(), ["charge", "refund"]);

    // Without compensations, the same workflow completes: nothing was left
    // to stop or to undo.
    let shared = Shared::new(true);
    let mut w = Workflow::new("no-undo");
    w.add("charge", &step("charge")).unwrap();
    let id = submit_workflow(&db, w).await;
    let worker = start(&db, &shared, true);
    assert_eq!(cancel_during_charge(&db, &shared, id).await, (0, 1));
    let status = wait_state(&db.pool, id, "completed").await;
    worker.stop().await;
    assert!(status.workflow.cancelled_at.is_some(), "{status:#?}");
}

/// A step with an ordering key that this worker is handed by the key's
/// previous task (a hand-on, which does not carry the step's workflow to
/// the worker) is judged by the database all the same: its success after
/// the cancel is recorded, and the saga refunds it.
#[tokio::test]
async fn a_keyed_step_handed_on_by_its_key_is_compensated_when_it_succeeds_after_a_cancel() {
    let db = TestDb::migrated().await;
    let shared = Shared::new(true);
    let keyed = || outbox::TaskOptions::new().ordering_key("card-7");
    let ahead = outbox::submit_with(&mut *db.conn().await, step("ahead"), keyed())
        .await
        .unwrap();
    let mut worker = start(&db, &shared, true);
    // Claimed alone: the charge, submitted once it runs, is not in its run.
    shared.ahead_started.acquire().await.unwrap().forget();
    let mut w = Workflow::new("keyed-checkout");
    w.add_step(
        "charge",
        &step("charge"),
        outbox::Step::new().options(keyed()),
    )
    .unwrap()
    .compensate("charge", &step("refund"))
    .unwrap()
    .add_after("ship", &["charge"], &step("ship"))
    .unwrap();
    let id = submit_workflow(&db, w).await;
    // The task ahead holds the key; once it completes, its outcome hands
    // the key and the charge on to this worker, which has idle slots.
    shared.go.add_permits(1);
    let ran = worker
        .wait_for(outbox::TaskEventKind::Completed, 1, Duration::from_secs(30))
        .await;
    assert!(ran.iter().any(|e| e.id == ahead), "{ran:?}");
    assert_eq!(cancel_during_charge(&db, &shared, id).await, (1, 1));
    let status = wait_state(&db.pool, id, "compensated").await;
    worker.stop().await;
    assert_eq!(
        step_states(&status),
        pairs(&[
            ("charge", "completed"),
            ("ship", "cancelled"),
            ("undo:charge", "completed"),
        ])
    );
    assert_eq!(*shared.log.lock().unwrap(), ["ahead", "charge", "refund"]);
}
