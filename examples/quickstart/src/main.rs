//! Run with: cargo run -p quickstart
//!
//! The README's minimal example: an order and the task that must follow it
//! are written in one transaction; a worker then runs the task. Uses
//! DATABASE_URL when set, else a private PostgreSQL started for the run.

use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, Worker, outbox_task,
};
use outbox_worker::local_postgres::{LocalPostgres, LocalPostgresOptions};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// The task: tell the customer their order was placed.
#[derive(Debug, Serialize, Deserialize)]
#[outbox_task(task_type = "order.confirm", queue = "orders", retry_delays = ["10s", "1m", "10m"])]
struct ConfirmOrder {
    order_id: i64,
    email: String,
}

/// The handler; its fields are the application state it needs.
struct Mailer {
    from: String,
}

impl TaskHandler<ConfirmOrder> for Mailer {
    async fn handle(&self, ctx: TaskContext, task: ConfirmOrder) -> HandlerResult {
        // Delivery is at-least-once: the task id is the idempotency key a
        // real mail API would be given.
        println!(
            "{} -> {}: order {} confirmed (idempotency key outbox-task-{}, attempt {})",
            self.from,
            task.email,
            task.order_id,
            ctx.id(),
            ctx.attempt()
        );
        Ok(Outcome::Success)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _cluster) = LocalPostgres::url_or_start(
        std::env::var("DATABASE_URL").ok(),
        &LocalPostgresOptions::default(),
    )?;
    let pool = sqlx::PgPool::connect(&url).await?;
    outbox::migrate(&pool).await?;
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, email text NOT NULL)")
        .execute(&pool)
        .await?;

    // The business row and the task commit together, or not at all.
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id, email) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .bind(42_i64)
        .bind("ada@example.com")
        .execute(&mut *tx)
        .await?;
    outbox::submit(
        &mut tx,
        ConfirmOrder {
            order_id: 42,
            email: "ada@example.com".into(),
        },
    )
    .await?;
    tx.commit().await?;

    let worker = Worker::builder(pool)
        .handler::<ConfirmOrder>(Mailer {
            from: "shop@example.com".into(),
        })
        .build()?;
    let mut events = worker.subscribe();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), events.recv()).await??;
        if event.kind == TaskEventKind::Completed {
            break;
        }
    }
    shutdown.cancel();
    running.await??;
    Ok(())
}
