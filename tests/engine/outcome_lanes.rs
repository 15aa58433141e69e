//! A worker's outcome lanes: the outcomes of one workflow share a lane, so
//! a workflow whose settle waits on a lock holds up one lane, not both.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outbox::workflow::workflow_status;
use outbox::{
    HandlerResult, Outcome, Step, TaskContext, TaskHandler, TaskId, Worker, WorkerConfig, Workflow,
    outbox_task,
};
use outbox_tests::process::wait_until;
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::watch;

/// A task that completes once the test opens its gate; `gate` picks which.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.lanes.gated", queue = "lanes")]
struct Gated {
    gate: usize,
}

#[derive(Clone)]
struct GatedHandler {
    gates: Vec<watch::Receiver<bool>>,
    /// Handlers that returned, by gate.
    returned: Arc<[AtomicUsize; GATES]>,
}

/// Step a's, step b's and the plain task's.
const GATES: usize = 3;

impl TaskHandler<Gated> for GatedHandler {
    async fn handle(&self, _ctx: TaskContext, task: Gated) -> HandlerResult {
        let mut go = self.gates[task.gate].clone();
        go.wait_for(|go| *go)
            .await
            .expect("the test outlives the task");
        self.returned[task.gate].fetch_add(1, Ordering::SeqCst);
        Ok(Outcome::Success)
    }
}

/// Sessions of this database waiting for a lock (the holder's, or that of
/// an outcome write waiting for it).
const WAITING: &str = "(SELECT count(*) FROM pg_stat_activity \
                        WHERE datname = current_database() AND wait_event_type = 'Lock')";

/// Whether task `id` completed.
fn completed(id: TaskId) -> String {
    format!(
        "EXISTS (SELECT 1 FROM outbox_all_tasks WHERE id = {} AND state = 'completed')",
        id.0
    )
}

/// Whether `condition` holds now.
async fn holds(pool: &PgPool, condition: &str) -> bool {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {condition}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Generous: the machine may be loaded.
const WITHIN: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_workflow_waiting_on_a_lock_holds_up_one_outcome_lane_and_plain_outcomes_go_on() {
    let db = TestDb::migrated().await;
    let pool = &db.pool;

    // Two independent steps: their tasks get consecutive ids, so routed by
    // task id their outcomes would take both lanes.
    let mut workflow = Workflow::new("lanes");
    workflow
        .add_step("a", &Gated { gate: 0 }, Step::new())
        .unwrap();
    workflow
        .add_step("b", &Gated { gate: 1 }, Step::new())
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let wf = workflow.submit(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let lane = wf.0.rem_euclid(2);
    let status = workflow_status(pool, wf).await.unwrap().expect("workflow");
    let ids: Vec<i64> = status
        .step_list
        .iter()
        .map(|s| s.task_id.expect("a root is released at submit").0)
        .collect();
    assert_ne!(ids[0].rem_euclid(2), ids[1].rem_euclid(2), "{ids:?}");

    // A plain task whose own lane is the other one: ids are drawn until
    // the next one falls there.
    let mut tx = pool.begin().await.unwrap();
    loop {
        let drawn: i64 =
            sqlx::query_scalar("SELECT nextval(pg_get_serial_sequence('outbox_tasks', 'id'))")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
        if (drawn + 1).rem_euclid(2) != lane {
            break;
        }
    }
    let plain = outbox::submit(&mut tx, Gated { gate: 2 }).await.unwrap();
    tx.commit().await.unwrap();
    assert_ne!(plain.0.rem_euclid(2), lane, "the plain task's lane");

    // Hold the workflow's row: the settle of its steps' outcomes waits.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM outbox_workflows WHERE id = $1 FOR UPDATE")
        .bind(wf.0)
        .execute(&mut *holder)
        .await
        .unwrap();

    let (open, gates): (Vec<_>, Vec<_>) = (0..GATES).map(|_| watch::channel(false)).unzip();
    let returned = Arc::new([const { AtomicUsize::new(0) }; GATES]);
    let worker = RunningWorker::start(
        Worker::builder(pool.clone())
            .config(WorkerConfig {
                finish_lanes: 2,
                // A heartbeat of step a's task would wait for its outcome's
                // row lock too: none falls within the test.
                heartbeat_interval: Duration::from_secs(600),
                heartbeat_timeout: Duration::from_secs(1200),
                ..WorkerConfig::default()
            })
            .handler::<Gated>(GatedHandler {
                gates,
                returned: Arc::clone(&returned),
            })
            .build()
            .unwrap(),
    );

    // Step a's outcome is written alone and waits on the lock.
    open[0].send(true).unwrap();
    let one_waits = format!("SELECT {WAITING} = 1");
    wait_until(pool, &one_waits, WITHIN).await;

    // Step b's outcome comes while a's write waits: routed by task id it
    // would take the other lane and wait there too, and the plain task's
    // outcome would find no lane free. It joins a's lane instead.
    open[1].send(true).unwrap();
    let b_returned = async || returned[1].load(Ordering::SeqCst) == 1;
    let deadline = tokio::time::Instant::now() + WITHIN;
    while !b_returned().await {
        assert!(tokio::time::Instant::now() < deadline, "step b never ran");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // The plain task's outcome goes down the other lane and is written
    // while the workflow's lane waits.
    open[2].send(true).unwrap();
    wait_until(
        pool,
        &format!("SELECT {} OR {WAITING} >= 2", completed(plain)),
        WITHIN,
    )
    .await;
    assert!(
        holds(pool, &completed(plain)).await,
        "the plain task completed while the workflow's lane waited"
    );
    assert!(
        holds(
            pool,
            &format!(
                "EXISTS (SELECT 1 FROM outbox_tasks WHERE id = {} AND state = 'processing')",
                ids[0]
            )
        )
        .await,
        "step a's outcome is still unwritten"
    );

    holder.commit().await.unwrap();
    wait_until(
        pool,
        &format!(
            "SELECT state = 'completed' FROM outbox_workflows WHERE id = {}",
            wf.0
        ),
        WITHIN,
    )
    .await;
    worker.stop().await;
}
