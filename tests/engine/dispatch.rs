//! Several dispatchers on one database: each task is handled exactly once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, TaskId, Worker, outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.dispatch.count", queue = "dispatch-tests")]
struct Count {
    n: u32,
}

#[derive(Clone, Default)]
struct Tally(Arc<Mutex<HashMap<TaskId, (u32, usize)>>>);

impl TaskHandler<Count> for Tally {
    async fn handle(&self, ctx: TaskContext, task: Count) -> HandlerResult {
        let mut tally = self.0.lock().unwrap();
        let entry = tally.entry(ctx.id()).or_insert((task.n, 0));
        entry.1 += 1;
        Ok(Outcome::Success)
    }
}

#[tokio::test]
async fn two_dispatchers_with_separate_pools_handle_2000_tasks_exactly_once() {
    let db = TestDb::migrated().await;
    let tally = Tally::default();
    let start = |pool| {
        RunningWorker::start(
            Worker::builder(pool)
                .config(outbox::WorkerConfig {
                    // A worker that missed the submit's NOTIFY (its listener
                    // still connecting) looks within 50 ms, not a second.
                    poll_interval: Duration::from_millis(50),
                    ..outbox::WorkerConfig::default()
                })
                .handler::<Count>(tally.clone())
                .queue("dispatch-tests", 16)
                .build()
                .unwrap(),
        )
    };
    let mut a = start(TestDb::pool_on(&db.url, 5).await);
    let mut b = start(TestDb::pool_on(&db.url, 5).await);
    // Both running before the tasks exist: one that started first could
    // otherwise drain them all before the other's first claim.
    outbox_tests::process::wait_until(
        &db.pool,
        "SELECT count(*) = 2 FROM outbox_workers WHERE expires_at > now()",
        Duration::from_secs(60),
    )
    .await;
    let ids = outbox::submit_batch(&mut *db.conn().await, (0..2000).map(|n| Count { n }))
        .await
        .unwrap();

    // Every completion is reported by exactly one of the two workers; wait
    // until the table says all are done, counting what each reported.
    let (mut from_a, mut from_b) = (0usize, 0usize);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while from_a + from_b < 2000 {
        tokio::select! {
            e = a.events.recv() => if e.unwrap().kind == TaskEventKind::Completed { from_a += 1 },
            e = b.events.recv() => if e.unwrap().kind == TaskEventKind::Completed { from_b += 1 },
            () = tokio::time::sleep_until(deadline) => panic!("timed out: {from_a} + {from_b} of 2000"),
        }
    }
    a.stop().await;
    b.stop().await;

    let tally = tally.0.lock().unwrap().clone();
    assert_eq!(tally.len(), 2000, "every task ran");
    let repeated: Vec<_> = tally.iter().filter(|(_, (_, runs))| *runs != 1).collect();
    assert!(
        repeated.is_empty(),
        "tasks run more than once: {repeated:?}"
    );
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(tally[id].0, i as u32, "task {id} got its own payload");
    }
    assert!(
        from_a > 0 && from_b > 0,
        "both dispatchers took part: {from_a} / {from_b}"
    );
    assert_eq!(
        db.count_by_state().await,
        vec![("completed".to_owned(), 2000)]
    );
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.dispatch.ordered", queue = "dispatch-order")]
struct Ordered {
    label: String,
}

#[derive(Clone, Default)]
struct Order(Arc<Mutex<Vec<String>>>);

impl TaskHandler<Ordered> for Order {
    async fn handle(&self, _ctx: TaskContext, task: Ordered) -> HandlerResult {
        self.0.lock().unwrap().push(task.label);
        Ok(Outcome::Success)
    }
}

#[tokio::test]
async fn priority_first_then_submission_order() {
    let db = TestDb::migrated().await;
    let mut batch = outbox::Batch::new();
    for (label, priority) in [
        ("p5-a", 5),
        ("p0-a", 0),
        ("p5-b", 5),
        ("p0-b", 0),
        ("p9", 9),
    ] {
        batch
            .push_with(
                &Ordered {
                    label: label.into(),
                },
                outbox::TaskOptions::new().priority(priority),
            )
            .unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    let order = Order::default();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Ordered>(order.clone())
            .queue("dispatch-order", 1)
            .build()
            .unwrap(),
    );
    worker
        .wait_for(TaskEventKind::Completed, 5, Duration::from_secs(20))
        .await;
    worker.stop().await;
    assert_eq!(
        *order.0.lock().unwrap(),
        ["p0-a", "p0-b", "p5-a", "p5-b", "p9"]
    );
}
