//! Task types shared by the tests and the test worker binary.

use std::time::Duration;

use outbox::{
    HandlerError, HandlerResult, Outcome, TaskContext, TaskHandler, WorkerBuilder, outbox_task,
};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// The queue the recording task runs on.
pub const RECORD_QUEUE: &str = "record";

/// Records each execution in the `executions` table, then sleeps `ms`
/// (stopping early if the worker shuts down), then succeeds. Executions are
/// recorded when they start, so an execution cut short by a kill counts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.record", queue = "record", retry_delays = ["1s", "1s", "1s", "1s", "1s"])]
pub struct Record {
    /// How long the handler works.
    pub ms: u64,
}

/// Runs [`Record`].
#[derive(Debug, Clone, Copy)]
pub struct Recorder;

impl TaskHandler<Record> for Recorder {
    async fn handle(&self, ctx: TaskContext, task: Record) -> HandlerResult {
        sqlx::query("INSERT INTO executions (task_id, attempt, pid) VALUES ($1, $2, $3)")
            .bind(ctx.id().0)
            .bind(ctx.attempt())
            .bind(i64::from(std::process::id()))
            .execute(ctx.pool())
            .await?;
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(task.ms)) => Ok(Outcome::Success),
            () = ctx.cancellation().cancelled() => Err(HandlerError::msg("cancelled by shutdown")),
        }
    }
}

/// Creates the table [`Record`] writes to.
pub async fn create_executions_table(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS executions (task_id bigint NOT NULL, attempt int NOT NULL, \
         pid bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(pool)
    .await
    .expect("create the executions table");
}

/// Ships an order: writes a row to `shipments` and completes the task in
/// the same transaction (`TaskContext::complete_in`). On its first attempt
/// it can kill its own process: `crash = "before"` after the writes and
/// before COMMIT, `"after"` right after COMMIT.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.ship", queue = "ship", retry_delays = ["1s", "1s", "1s"])]
pub struct Ship {
    /// The order shipped.
    pub order_id: i64,
    /// "before", "after" or "".
    pub crash: String,
}

/// Runs [`Ship`].
#[derive(Debug, Clone, Copy)]
pub struct Shipper;

impl TaskHandler<Ship> for Shipper {
    async fn handle(&self, ctx: TaskContext, task: Ship) -> HandlerResult {
        let mut tx = ctx.pool().begin().await?;
        sqlx::query("INSERT INTO shipments (order_id, task_id, attempt) VALUES ($1, $2, $3)")
            .bind(task.order_id)
            .bind(ctx.id().0)
            .bind(ctx.attempt())
            .execute(&mut *tx)
            .await?;
        ctx.complete_in(&mut tx).await?;
        if task.crash == "before" && ctx.attempt() == 1 {
            std::process::abort();
        }
        tx.commit().await?;
        if task.crash == "after" && ctx.attempt() == 1 {
            std::process::abort();
        }
        Ok(Outcome::Success)
    }
}

/// Creates the table [`Ship`] writes to.
pub async fn create_shipments_table(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS shipments (order_id bigint NOT NULL, task_id bigint NOT NULL, \
         attempt int NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("create the shipments table");
}

/// Adds the harness's handlers to a worker.
pub fn register(builder: WorkerBuilder) -> WorkerBuilder {
    builder.handler::<Record>(Recorder).handler::<Ship>(Shipper)
}
