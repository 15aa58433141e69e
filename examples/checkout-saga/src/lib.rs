//! A checkout saga: charge the card, then reserve stock, then ship; if the
//! stock cannot be reserved (or shipping dies), what completed is undone in
//! reverse order: the reservation released, the charge refunded.
//!
//! The order row and the workflow are written in one transaction, so an
//! order never exists without its saga (or the other way round). Every
//! effect is keyed by the order id under a UNIQUE constraint or a guarded
//! UPDATE, so a step that runs twice (a worker died after the effect but
//! before recording it) changes nothing the second time.

use outbox::{
    HandlerError, HandlerResult, Outcome, TaskContext, TaskHandler, Workflow, WorkflowId,
};
use outbox::{WorkerBuilder, outbox_task};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// Charge the customer's card for an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "shop.charge", queue = "shop", retry_delays = ["1s", "5s", "30s"])]
pub struct Charge {
    /// The order.
    pub order_id: i64,
    /// How much.
    pub cents: i64,
}

/// Refund an order's charge: the compensation of [`Charge`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "shop.refund", queue = "shop", retry_delays = ["1s", "5s", "30s", "5m"])]
pub struct Refund {
    /// The order.
    pub order_id: i64,
}

/// Reserve stock for an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "shop.reserve", queue = "shop", retry_delays = ["1s", "5s", "30s"])]
pub struct Reserve {
    /// The order.
    pub order_id: i64,
    /// The product.
    pub sku: String,
    /// How many.
    pub quantity: i64,
}

/// Give reserved stock back: the compensation of [`Reserve`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "shop.release", queue = "shop", retry_delays = ["1s", "5s", "30s", "5m"])]
pub struct Release {
    /// The order.
    pub order_id: i64,
}

/// Hand an order to the carrier.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "shop.ship", queue = "shop", retry_delays = ["1s", "5s", "30s"])]
pub struct Ship {
    /// The order.
    pub order_id: i64,
}

/// What the charge step returns, and the refund reads back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    /// The payment provider's reference (here, our payments row).
    pub payment_id: i64,
}

/// Runs every step of the saga against the shop's tables.
#[derive(Debug, Clone, Copy)]
pub struct Shop;

impl TaskHandler<Charge> for Shop {
    async fn handle(&self, ctx: TaskContext, task: Charge) -> HandlerResult {
        // One payment per order, whatever the number of attempts.
        let payment_id: i64 = sqlx::query_scalar(
            "INSERT INTO payments (order_id, cents) VALUES ($1, $2)
             ON CONFLICT (order_id) DO UPDATE SET order_id = EXCLUDED.order_id
             RETURNING id",
        )
        .bind(task.order_id)
        .bind(task.cents)
        .fetch_one(ctx.pool())
        .await?;
        Outcome::success_with(&Receipt { payment_id })
    }
}

impl TaskHandler<Refund> for Shop {
    async fn handle(&self, ctx: TaskContext, task: Refund) -> HandlerResult {
        // The charge step's result says which payment to refund.
        let receipt: Receipt = ctx
            .step_result("charge")
            .await?
            .ok_or_else(|| HandlerError::msg("the charge left no receipt"))?;
        sqlx::query("UPDATE payments SET refunded = true WHERE id = $1 AND order_id = $2")
            .bind(receipt.payment_id)
            .bind(task.order_id)
            .execute(ctx.pool())
            .await?;
        Ok(Outcome::Success)
    }
}

impl TaskHandler<Reserve> for Shop {
    async fn handle(&self, ctx: TaskContext, task: Reserve) -> HandlerResult {
        let mut tx = ctx.pool().begin().await?;
        let already: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM reservations WHERE order_id = $1)")
                .bind(task.order_id)
                .fetch_one(&mut *tx)
                .await?;
        if !already {
            let taken = sqlx::query(
                "UPDATE stock SET available = available - $2 WHERE sku = $1 AND available >= $2",
            )
            .bind(&task.sku)
            .bind(task.quantity)
            .execute(&mut *tx)
            .await?;
            if taken.rows_affected() == 0 {
                // Not a transient failure: retrying will not make stock.
                return Ok(Outcome::GiveUp(format!(
                    "{} x {} is not in stock",
                    task.quantity, task.sku
                )));
            }
            sqlx::query("INSERT INTO reservations (order_id, sku, quantity) VALUES ($1, $2, $3)")
                .bind(task.order_id)
                .bind(&task.sku)
                .bind(task.quantity)
                .execute(&mut *tx)
                .await?;
        }
        ctx.complete_in(&mut tx).await?;
        tx.commit().await?;
        Ok(Outcome::Success)
    }
}

impl TaskHandler<Release> for Shop {
    async fn handle(&self, ctx: TaskContext, task: Release) -> HandlerResult {
        let mut tx = ctx.pool().begin().await?;
        sqlx::query(
            "WITH gone AS (DELETE FROM reservations WHERE order_id = $1 RETURNING sku, quantity)
             UPDATE stock SET available = available + gone.quantity FROM gone WHERE stock.sku = gone.sku",
        )
        .bind(task.order_id)
        .execute(&mut *tx)
        .await?;
        ctx.complete_in(&mut tx).await?;
        tx.commit().await?;
        Ok(Outcome::Success)
    }
}

impl TaskHandler<Ship> for Shop {
    async fn handle(&self, ctx: TaskContext, task: Ship) -> HandlerResult {
        sqlx::query("INSERT INTO shipments (order_id) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(task.order_id)
            .execute(ctx.pool())
            .await?;
        Ok(Outcome::Success)
    }
}

/// Registers the saga's handlers on a worker.
pub fn register(builder: WorkerBuilder) -> WorkerBuilder {
    builder
        .handler::<Charge>(Shop)
        .handler::<Refund>(Shop)
        .handler::<Reserve>(Shop)
        .handler::<Release>(Shop)
        .handler::<Ship>(Shop)
}

/// The saga of one order: charge (undone by a refund), then reserve
/// (undone by a release), then ship.
pub fn checkout(
    order_id: i64,
    sku: &str,
    quantity: i64,
    cents: i64,
) -> Result<Workflow, outbox::Error> {
    let mut saga = Workflow::new("checkout");
    saga.add("charge", &Charge { order_id, cents })?
        .compensate("charge", &Refund { order_id })?
        .add_after(
            "reserve",
            &["charge"],
            &Reserve {
                order_id,
                sku: sku.to_owned(),
                quantity,
            },
        )?
        .compensate("reserve", &Release { order_id })?
        .add_after("ship", &["reserve"], &Ship { order_id })?;
    Ok(saga)
}

/// Places an order: the order row and its saga in one transaction.
pub async fn place_order(
    pool: &PgPool,
    order_id: i64,
    sku: &str,
    quantity: i64,
    cents: i64,
) -> Result<WorkflowId, outbox::Error> {
    let saga = checkout(order_id, sku, quantity, cents)?;
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id, sku, quantity) VALUES ($1, $2, $3)")
        .bind(order_id)
        .bind(sku)
        .bind(quantity)
        .execute(&mut *tx)
        .await?;
    let id = saga.submit(&mut tx).await?;
    tx.commit().await?;
    Ok(id)
}

/// Creates the shop's tables (with 5 lamps in stock) and outbox's schema.
pub async fn setup(pool: &PgPool) -> Result<(), outbox::Error> {
    outbox::migrate(pool).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, sku text NOT NULL, quantity bigint NOT NULL);
         CREATE TABLE IF NOT EXISTS payments (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             order_id bigint NOT NULL UNIQUE,
             cents bigint NOT NULL,
             refunded boolean NOT NULL DEFAULT false);
         CREATE TABLE IF NOT EXISTS stock (sku text PRIMARY KEY, available bigint NOT NULL CHECK (available >= 0));
         CREATE TABLE IF NOT EXISTS reservations (order_id bigint PRIMARY KEY, sku text NOT NULL, quantity bigint NOT NULL);
         CREATE TABLE IF NOT EXISTS shipments (order_id bigint PRIMARY KEY);
         INSERT INTO stock VALUES ('lamp', 5) ON CONFLICT DO NOTHING;",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Waits (at most `within`) until the saga reaches a final state, and
/// returns it.
pub async fn wait_for_end(
    pool: &PgPool,
    id: WorkflowId,
    within: std::time::Duration,
) -> Result<String, outbox::Error> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let status = outbox::workflow::workflow_status(pool, id)
            .await?
            .ok_or_else(|| outbox::Error::InvalidWorkflow(format!("workflow {id} is gone")))?;
        let state = status.workflow.state;
        if !matches!(state.as_str(), "running" | "compensating") {
            return Ok(state);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(outbox::Error::InvalidWorkflow(format!(
                "workflow {id} is still {state} after {within:?}"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
