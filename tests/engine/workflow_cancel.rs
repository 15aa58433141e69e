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
    /// A charge that waits for the test (not its token) takes one.
    go: Semaphore,
    wait_for_token: bool,
}

impl Shared {
    fn new(wait_for_token: bool) -> Arc<Self> {
        Arc::new(Self {
            log: Mutex::default(),
            started: Semaphore::new(0),
            go: Semaphore::new(0),
            wait_for_token,
        })
    }
}

#[derive(Clone)]
struct Handler(Arc<Shared>);

impl TaskHandler<Step> for Handler {
    async fn handle(&self, ctx: TaskContext, task: Step) -> HandlerResult {
        self.0.log.lock().unwrap().push(task.label.clone());
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
    let mut tx = db.pool.begin().await.unwrap();
    let id = checkout().submit(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    id
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
