//! docs/guide.md, section 8: the test helpers, compiled (not run).

use std::error::Error;
use std::time::Duration;

use guide_snippets::guide::{DeliverOrderCreated, OrderCreated, RefundIssued};
use outbox::{HandlerResult, Outcome, TaskContext, TaskHandler, Worker};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// What the snippet's handler returns.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt { url: String }

/// A handler with a result.
struct Receipts;

impl TaskHandler<OrderCreated> for Receipts {
    async fn handle(&self, _ctx: TaskContext, task: OrderCreated) -> HandlerResult {
        Outcome::success_with(&Receipt { url: format!("https://example.com/r/{}", task.order_id) })
    }
}

async fn helpers(pool: PgPool, id: outbox::TaskId) -> Result<(), Box<dyn Error>> {
    let mut tx = pool.begin().await?;
    let receipts = Receipts;
    let nightly = outbox::periodic::PeriodicTask::new("nightly", "0 3 * * *", &OrderCreated { order_id: 0 })?;
    let my_handler = DeliverOrderCreated::new("http://127.0.0.1:9/hook".to_owned());
    let worker = Worker::builder(pool.clone())
        .handler::<OrderCreated>(DeliverOrderCreated::new("http://127.0.0.1:9/hook".to_owned()))
        .build()?;
use outbox::{testing, TaskEventKind, TaskId};

// The code under test submitted in this transaction:
testing::assert_submitted(&mut tx, &OrderCreated { order_id: 7 }).await;
testing::assert_none_submitted::<RefundIssued>(&mut tx).await;
let all: Vec<(TaskId, OrderCreated)> = testing::submitted(&mut tx).await;

// Run one submitted task's handler inline (nothing written back, so you can
// run it twice and check your side effect is idempotent; name the task type
// when the handler handles more than one):
testing::run_inline::<OrderCreated>(&pool, id, &my_handler).await?;

// Run a worker until nothing on its queues is due, running or waiting for a
// retry (retries skip their backoff), then stop:
let report = testing::drain(worker, Duration::from_secs(10)).await;
assert_eq!(report.count(TaskEventKind::Completed), 3);

// The events this transaction emitted (read them before it ends):
let placed = testing::assert_emitted(&mut tx, "order", "7", "order.placed").await;
assert_eq!(placed.payload["total_cents"], 990);
testing::assert_none_emitted(&mut tx, "order.cancelled").await;

// The result a handler returns with Outcome::success_with:
let receipt: Option<Receipt> = testing::result_of(&testing::run_inline(&pool, id, &receipts).await);

// A periodic task's tick, submitted now (drain then runs it), and its schedule:
let tick: TaskId = testing::tick(&mut tx, &nightly).await;
let next_run = nightly.schedule().next_after(chrono::Utc::now());
    let _ = (all, receipt, tick, next_run);
    Ok(())
}
