//! docs/guide.md, section 8: the test helpers, compiled (not run).

use std::error::Error;
use std::time::Duration;

use guide_snippets::guide::{DeliverOrderCreated, OrderCreated, RefundIssued};
use outbox::Worker;
use sqlx::PgPool;

async fn helpers(pool: PgPool, id: outbox::TaskId) -> Result<(), Box<dyn Error>> {
    let mut tx = pool.begin().await?;
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
// run it twice and check your side effect is idempotent):
testing::run_inline(&pool, id, &my_handler).await?;

// Run a worker until nothing on its queues is due, running or waiting for a
// retry (retries skip their backoff), then stop:
let report = testing::drain(worker, Duration::from_secs(10)).await;
assert_eq!(report.count(TaskEventKind::Completed), 3);
    let _ = all;
    Ok(())
}
