//! Run with: DATABASE_URL=postgres://... cargo run -p custom-worker -- run --queue billing=4
//!
//! An application's own worker binary. Its task types are linked in (the
//! `#[outbox_task]` registrations are found on their own), its handlers are
//! registered in one function, and it gets the whole `outbox-worker` CLI:
//! `run`, `migrate`, `tasks submit invoice.send '{"invoice_id": 1}'`,
//! `tasks list`, `stats`, `--help`.

use outbox::{HandlerResult, Outcome, TaskContext, TaskHandler, WorkerBuilder, outbox_task};
use serde::{Deserialize, Serialize};

/// Send an invoice by email.
#[derive(Debug, Serialize, Deserialize)]
#[outbox_task(task_type = "invoice.send", queue = "billing", retry_delays = ["30s", "5m", "1h"])]
struct SendInvoice {
    invoice_id: i64,
}

/// The handler, with its state: the sender address, built once in `main`,
/// and the pool the operator's `--database-url` opened.
struct Billing {
    from: String,
    pool: outbox::sqlx::PgPool,
}

impl TaskHandler<SendInvoice> for Billing {
    async fn handle(&self, ctx: TaskContext, task: SendInvoice) -> HandlerResult {
        // Log lines inside a handler carry task_id, task_type and attempt.
        let server: String = outbox::sqlx::query_scalar("SELECT current_setting('server_version')")
            .fetch_one(&self.pool)
            .await?;
        tracing::info!(from = %self.from, %server, key = %format!("outbox-task-{}", ctx.id()), "invoice {} sent", task.invoice_id);
        Ok(Outcome::Success)
    }
}

fn main() -> std::process::ExitCode {
    // State built once and captured by the registration closure, which runs
    // for every worker the CLI builds.
    let from = std::env::var("BILLING_FROM").unwrap_or_else(|_| "billing@example.com".to_owned());
    outbox_worker::main_with(move |worker: WorkerBuilder| {
        let pool = worker.pool().clone();
        worker.handler::<SendInvoice>(Billing {
            from: from.clone(),
            pool,
        })
    })
}
