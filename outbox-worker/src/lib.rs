//! The outbox worker: the stock `outbox-worker` binary's commands as a
//! library (an application builds its own worker binary, with its task types
//! linked in, from one call to [`main_with`]), the built-in diagnostic task
//! types, Prometheus metrics, and a private PostgreSQL for demos, benchmarks
//! and tests.

mod admin_cmd;
mod bench;
pub mod builtin;
pub mod cli;
mod commit;
mod connect;
pub mod dashboard;
mod dashboard_cmd;
mod demo;
mod events_cmd;
mod explain_cmd;
mod failure;
mod flags;
pub mod local_broker;
pub mod local_postgres;
pub mod metrics;
#[cfg(feature = "otel")]
mod otel;
mod payload;
mod periodic_cmd;
mod queues_cmd;
mod signals;
mod task_types;
mod when;
mod workflows_cmd;

pub use cli::{main, main_with};
pub use signals::stop_on_signal;

/// Registers an application's handlers on a worker the CLI builds: the
/// closure given to [`main_with`], shared by every command that builds a
/// worker (`run`, `demo`, `bench`).
pub type Register =
    std::sync::Arc<dyn Fn(outbox::WorkerBuilder) -> outbox::WorkerBuilder + Send + Sync>;
