//! Run with: DATABASE_URL=postgres://... cargo run -p python-service-example \
//!     --bin welcome-worker -- run --queue email=4
//!
//! The worker for the Python service: `email.welcome` linked in, the full
//! `outbox-worker` CLI from one call.

use outbox::WorkerBuilder;
use python_service_example::{SendWelcome, WelcomeEmail};

fn register(worker: WorkerBuilder) -> WorkerBuilder {
    worker.handler::<WelcomeEmail>(SendWelcome)
}

fn main() -> std::process::ExitCode {
    outbox_worker::main_with(register)
}
