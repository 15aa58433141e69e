//! Why at-least-once is safe: the handler's effect (a payment row) carries
//! the task id as its idempotency key under a UNIQUE constraint, so running
//! the task twice (a worker died after the effect but before recording the
//! outcome) writes it once.

use outbox::{HandlerResult, Outcome, TaskContext, TaskHandler, outbox_task};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// Capture a payment for an invoice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[outbox_task(task_type = "payment.capture", queue = "payments")]
pub struct CapturePayment {
    /// The invoice paid.
    pub invoice_id: i64,
    /// How much.
    pub amount_cents: i64,
}

/// Writes the payment; a duplicate execution is a no-op.
#[derive(Debug, Clone, Copy)]
pub struct Capture;

impl TaskHandler<CapturePayment> for Capture {
    async fn handle(&self, ctx: TaskContext, task: CapturePayment) -> HandlerResult {
        // The task id is stable across attempts: the same task always
        // produces the same key, and the UNIQUE constraint does the rest.
        sqlx::query(
            "INSERT INTO payments (idempotency_key, invoice_id, amount_cents) VALUES ($1, $2, $3)
             ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(format!("outbox-task-{}", ctx.id()))
        .bind(task.invoice_id)
        .bind(task.amount_cents)
        .execute(ctx.pool())
        .await?;
        Ok(Outcome::Success)
    }
}

/// Creates the payments table and outbox's schema.
pub async fn setup(pool: &PgPool) -> Result<(), outbox::Error> {
    outbox::migrate(pool).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS payments (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             idempotency_key text NOT NULL UNIQUE,
             invoice_id bigint NOT NULL,
             amount_cents bigint NOT NULL
         )",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Payments recorded for an invoice.
pub async fn payments_for(pool: &PgPool, invoice_id: i64) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM payments WHERE invoice_id = $1")
        .bind(invoice_id)
        .fetch_one(pool)
        .await
}
