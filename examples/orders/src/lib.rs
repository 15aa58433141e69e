//! Shared by the orders service and its worker: the `order.created` task
//! type, its handler (deliver the event to a webhook), and the schema.

use std::time::Duration;

use outbox::{HandlerError, HandlerResult, Outcome, TaskContext, TaskHandler, outbox_task};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// An order was placed: tell the outside world.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "order.created", queue = "orders", retry_delays = ["1s", "5s", "30s", "2m", "10m", "1h"])]
pub struct OrderCreated {
    /// The new order's id.
    pub order_id: i64,
    /// Who placed it.
    pub customer: String,
    /// Its total.
    pub amount_cents: i64,
}

/// The header that carries the idempotency key to the webhook.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// The idempotency key of a delivery: the task id, stable across retries
/// and duplicate executions.
pub fn idempotency_key(ctx: &TaskContext) -> String {
    format!("outbox-task-{}", ctx.id())
}

/// Delivers `order.created` events to a webhook.
#[derive(Debug, Clone)]
pub struct DeliverOrderCreated {
    /// The HTTP client (application state lives in the handler).
    pub client: reqwest::Client,
    /// Where to POST the event.
    pub webhook_url: String,
}

impl DeliverOrderCreated {
    /// A deliverer posting to `webhook_url` with a 10 s timeout.
    pub fn new(webhook_url: String) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("an HTTP client");
        Self {
            client,
            webhook_url,
        }
    }
}

impl TaskHandler<OrderCreated> for DeliverOrderCreated {
    async fn handle(&self, ctx: TaskContext, task: OrderCreated) -> HandlerResult {
        let event = serde_json::json!({
            "type": "order.created",
            "order_id": task.order_id,
            "customer": task.customer,
            "amount_cents": task.amount_cents,
        });
        let response = self
            .client
            .post(&self.webhook_url)
            .header(IDEMPOTENCY_HEADER, idempotency_key(&ctx))
            .json(&event)
            .send()
            .await?;
        let status = response.status();
        if status.is_success() {
            Ok(Outcome::Success)
        } else if status.is_client_error() && status.as_u16() != 429 {
            // The receiver will never accept this event: retrying is useless.
            Ok(Outcome::GiveUp(format!(
                "webhook refused the event: HTTP {status}"
            )))
        } else {
            Err(HandlerError::msg(format!("webhook answered HTTP {status}")))
        }
    }
}

/// Creates the orders table and applies outbox's migrations.
pub async fn setup(pool: &PgPool) -> Result<(), outbox::Error> {
    outbox::migrate(pool).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS orders (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             customer text NOT NULL,
             amount_cents bigint NOT NULL CHECK (amount_cents > 0),
             created_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .execute(pool)
    .await?;
    Ok(())
}
