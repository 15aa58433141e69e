//! Built-in diagnostic task types, carried by the stock binary: used by
//! smoke tests, the demo and the benchmark. Every program that uses this
//! crate links them (on `default`); they are declared `diagnostic`, so that
//! a worker of the program's own serving `default` is not refused for
//! lacking their handlers (only [`register`] adds those).

use std::time::Duration;

use outbox::{
    HandlerError, HandlerResult, Outcome, TaskContext, TaskHandler, WorkerBuilder, outbox_task,
};
use serde::{Deserialize, Serialize};

/// `outbox.noop`: does nothing and succeeds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[outbox_task(task_type = "outbox.noop", diagnostic = true)]
pub struct Noop {}

/// `outbox.sleep` {"ms": N}: sleeps N milliseconds, then succeeds; stops
/// early (and is retried) when the worker shuts down.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "outbox.sleep", diagnostic = true)]
pub struct Sleep {
    /// How long to sleep.
    pub ms: u64,
}

/// `outbox.fail` {"times": N, "message": "..."}: fails its first N attempts
/// with the message, then succeeds. Short retry delays, three attempts, so
/// that a demo shows both recoveries and dead tasks within seconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "outbox.fail", retry_delays = ["1s", "2s", "3s"], diagnostic = true)]
pub struct Fail {
    /// How many attempts fail.
    pub times: i32,
    /// The error message of each failure.
    #[serde(default = "default_fail_message")]
    pub message: String,
}

fn default_fail_message() -> String {
    "outbox.fail: failing on purpose".to_owned()
}

/// Runs the built-in task types.
#[derive(Debug, Clone, Copy, Default)]
pub struct Builtins;

impl TaskHandler<Noop> for Builtins {
    async fn handle(&self, _ctx: TaskContext, _task: Noop) -> HandlerResult {
        Ok(Outcome::Success)
    }
}

impl TaskHandler<Sleep> for Builtins {
    async fn handle(&self, ctx: TaskContext, task: Sleep) -> HandlerResult {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(task.ms)) => Ok(Outcome::Success),
            () = ctx.cancellation().cancelled() => Err(HandlerError::msg("cancelled by shutdown")),
        }
    }
}

impl TaskHandler<Fail> for Builtins {
    async fn handle(&self, ctx: TaskContext, task: Fail) -> HandlerResult {
        if ctx.attempt() <= task.times {
            Err(HandlerError::msg(task.message))
        } else {
            Ok(Outcome::Success)
        }
    }
}

/// Registers the built-in handlers on a worker.
pub fn register(builder: WorkerBuilder) -> WorkerBuilder {
    builder
        .handler::<Noop>(Builtins)
        .handler::<Sleep>(Builtins)
        .handler::<Fail>(Builtins)
}
