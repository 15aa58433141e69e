//! README.md, "A minimal example".

use std::error::Error;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use outbox::{outbox_task, HandlerResult, Outcome, TaskContext, TaskHandler, Worker};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "order.confirm", queue = "orders", retry_delays = ["10s", "1m", "10m"])]
struct ConfirmOrder { order_id: i64, email: String }

struct Mailer { from: String }            // application state lives in the handler

impl TaskHandler<ConfirmOrder> for Mailer {
    async fn handle(&self, ctx: TaskContext, task: ConfirmOrder) -> HandlerResult {
        // send mail with idempotency key ctx.id() ...
        let _ = (&self.from, ctx.id(), task.order_id, task.email);
        Ok(Outcome::Success)              // or Err(e) to retry, RetryAfter(d), GiveUp(reason)
    }
}

/// The request handler's half.
pub async fn request(pool: PgPool, email: String) -> Result<(), Box<dyn Error>> {
// In a request handler: one transaction for the order and its task.
let mut tx = pool.begin().await?;
sqlx::query("INSERT INTO orders (id, email) VALUES ($1, $2)").bind(42_i64).bind(&email)
    .execute(&mut *tx).await?;
outbox::submit(&mut tx, ConfirmOrder { order_id: 42, email }).await?;
tx.commit().await?;
    Ok(())
}

/// The worker process's half.
pub async fn worker(pool: PgPool, shutdown_token: CancellationToken) -> Result<(), Box<dyn Error>> {
// In the worker process:
outbox::migrate(&pool).await?;
Worker::builder(pool).handler::<ConfirmOrder>(Mailer { from: "shop@example.com".into() })
    .build()?                             // refuses to start, listing every problem
    .run(shutdown_token).await?;
    Ok(())
}
