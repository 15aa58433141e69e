//! # outbox: a transactional outbox task engine on PostgreSQL
//!
//! Write your business rows and the tasks that must follow from them in one
//! transaction; workers on any number of machines claim those tasks with
//! `FOR UPDATE SKIP LOCKED`, run typed handlers, and retry with backoff.
//!
//! Delivery is **at-least-once**: a task whose worker dies after doing the
//! work but before recording it runs again. Handlers get a stable task id
//! ([`TaskContext::id`]) to use as the idempotency key of their side effects.
//!
//! ```no_run
//! use outbox::{outbox_task, HandlerResult, Outcome, TaskContext, TaskHandler, Worker};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! #[outbox_task(task_type = "report.generate", queue = "reports", retry_delays = ["10s", "1m"])]
//! struct GenerateReport { month: u32 }
//!
//! struct Reports;
//! impl TaskHandler<GenerateReport> for Reports {
//!     async fn handle(&self, ctx: TaskContext, task: GenerateReport) -> HandlerResult {
//!         println!("report for month {} (task {})", task.month, ctx.id());
//!         Ok(Outcome::Success)
//!     }
//! }
//!
//! # async fn run(pool: sqlx::PgPool) -> outbox::Result<()> {
//! outbox::migrate(&pool).await?;
//! let mut tx = pool.begin().await?;
//! // ... your own inserts on &mut *tx ...
//! outbox::submit(&mut tx, GenerateReport { month: 5 }).await?;
//! tx.commit().await?;
//!
//! let worker = Worker::builder(pool).handler::<GenerateReport>(Reports).build()?;
//! worker.run(tokio_util::sync::CancellationToken::new()).await
//! # }
//! ```

// Lets the macro's generated `::outbox::...` paths resolve inside this crate
// too (its own tests and built-in task types).
#[allow(
    unused_extern_crates,
    reason = "used by macro expansions in tests and built-in types"
)]
extern crate self as outbox;

pub mod admin;
#[doc(hidden)]
pub mod bench_support;
mod clock;
mod db;
mod durable;
mod error;
pub mod events;
mod explain;
mod handler;
pub mod maintenance;
mod migrate;
mod options;
pub mod periodic;
pub mod pooler;
mod random;
mod records;
pub mod relay;
pub mod retry;
mod signal;
mod submit;
mod task;
mod task_result;
#[cfg(feature = "testing")]
pub mod testing;
mod trace;
mod wakeup;
mod worker;
pub mod workflow;

/// The sqlx this crate is built on (0.9): use it for the connections and
/// transactions you hand to `submit`, so that the types match. Two sqlx
/// versions in one application show up as "expected `&mut PgConnection`,
/// found `&mut Transaction`" errors.
pub use sqlx;

pub use clock::Clock;
pub use db::classify::is_transient;
pub use db::session::{CLIENT_MARGIN, ENGINE_APPLICATION_NAME};
pub use durable::MAX_DURABLE_STEP_NAME;
pub use error::{Error, Result, StartupProblems};
pub use events::{Event, emit, emit_all, emit_once};
pub use handler::{
    HandlerError, HandlerResult, MAX_RESULT_BYTES, Outcome, TaskContext, TaskHandler,
};
pub use migrate::{
    MIGRATIONS, MigrateOptions, Migration, MigrationReport, SchemaStatus, latest_version, migrate,
    migrate_to, migrate_with, schema_status,
};
pub use options::{
    MAX_ATTEMPTS_LIMIT, MAX_DELAY, MAX_UNIQUE_KEY, PRIORITY_MAX, PRIORITY_MIN, TaskOptions, Unique,
};
pub use outbox_macros::outbox_task;
pub use signal::{WAIT_RECHECK, signal};
pub use submit::{Batch, Submitted, submit, submit_batch, submit_detailed, submit_with};
pub use task::{
    DEFAULT_QUEUE, RegisteredTask, RegisteredUnique, Task, TaskId, find_registered,
    registered_tasks,
};
pub use task_result::result;
pub use wakeup::NOTIFY_DEBOUNCE;
pub use worker::{
    CountersSnapshot, DEFAULT_CONCURRENCY, MAINTENANCE_LEASE, MAX_CONCURRENCY, TaskEvent,
    TaskEventKind, Worker, WorkerBuilder, WorkerConfig, WorkerCounters,
};
pub use workflow::{OnParentDead, Step, Workflow, WorkflowId};

/// What `#[outbox_task]` expands to refers to; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::options::unique_from_fields;
    pub use crate::retry::{DEFAULT_RETRY_DELAYS, retry_table};
    pub use crate::task::{check_payload, no_ordering, no_unique, ordering_of, unique_of};
    pub use inventory;
    pub use std::time::Duration;
}
