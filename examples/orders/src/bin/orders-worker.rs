//! Run with: DATABASE_URL=postgres://... WEBHOOK_URL=http://127.0.0.1:3001/events \
//!     cargo run -p orders-example --bin orders-worker -- run --queue orders=8
//!
//! The application's own worker binary: its task types linked in, the full
//! `outbox-worker` CLI (run, migrate, tasks, stats, ...) from one call.

use orders_example::{DeliverOrderCreated, OrderCreated};
use outbox::WorkerBuilder;

fn register(worker: WorkerBuilder) -> WorkerBuilder {
    let webhook_url =
        std::env::var("WEBHOOK_URL").unwrap_or_else(|_| "http://127.0.0.1:3001/events".to_owned());
    worker.handler::<OrderCreated>(DeliverOrderCreated::new(webhook_url))
}

fn main() -> std::process::ExitCode {
    outbox_worker::main_with(register)
}
