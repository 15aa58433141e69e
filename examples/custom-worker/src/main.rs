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

/// The handler, with its state (here just the sender address).
struct Billing {
    from: String,
}

impl TaskHandler<SendInvoice> for Billing {
    async fn handle(&self, ctx: TaskContext, task: SendInvoice) -> HandlerResult {
        // Log lines inside a handler carry task_id, task_type and attempt.
        tracing::info!(from = %self.from, key = %format!("outbox-task-{}", ctx.id()), "invoice {} sent", task.invoice_id);
        Ok(Outcome::Success)
    }
}

fn register(worker: WorkerBuilder) -> WorkerBuilder {
    worker.handler::<SendInvoice>(Billing {
        from: "billing@example.com".to_owned(),
    })
}

fn main() -> std::process::ExitCode {
    outbox_worker::main_with(register)
}
