//! Runs one claimed attempt: decode, call the handler with no transaction
//! or lock held, and turn its result into the outcome TX2 will write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::task::AbortHandle;
use tracing::Instrument;

use super::Shared;
use super::events::TaskEventKind;
use crate::db::{self, ClaimedTask, Finish, NextState};
use crate::handler::{Outcome, TaskContext};
use crate::options::clamped_delay_micros;
use crate::retry::delay_after_failure;
use crate::task::TaskId;

/// Histogram of handler run time in seconds, by task type.
pub(crate) const HANDLER_DURATION: &str = "outbox_handler_duration_seconds";

/// An outcome on its way to the completer.
#[derive(Debug)]
pub(crate) struct Done {
    pub(crate) finish: Finish,
    pub(crate) kind: TaskEventKind,
    pub(crate) task_type: Arc<str>,
}

/// The attempts whose handlers are running, by task id, with their claim
/// (for fencing) and a handle to abort them at the end of a shutdown.
#[derive(Clone, Default)]
pub(crate) struct InFlight(Arc<Mutex<RunningAttempts>>);

/// Task id -> (claims at the claim, abort handle of the running handler).
type RunningAttempts = HashMap<i64, (i32, Option<AbortHandle>)>;

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, RunningAttempts> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn insert(&self, id: i64, claims: i32) {
        self.lock().insert(id, (claims, None));
    }

    fn set_abort(&self, id: i64, abort: AbortHandle) {
        if let Some(entry) = self.lock().get_mut(&id) {
            entry.1 = Some(abort);
        }
    }

    /// The ids of every running attempt.
    pub(crate) fn ids(&self) -> Vec<i64> {
        self.lock().keys().copied().collect()
    }

    fn remove(&self, id: i64) {
        self.lock().remove(&id);
    }

    /// Takes every running attempt out of the map.
    fn drain(&self) -> Vec<(i64, i32, Option<AbortHandle>)> {
        self.lock()
            .drain()
            .map(|(id, (claims, abort))| (id, claims, abort))
            .collect()
    }
}

/// Runs one attempt and queues its outcome. The permit (the executor slot)
/// is held until the outcome is queued, so a slow completer slows claiming
/// instead of piling up outcomes in memory.
pub(crate) async fn execute(
    shared: Arc<Shared>,
    task: ClaimedTask,
    done: mpsc::Sender<Done>,
    permit: OwnedSemaphorePermit,
) {
    let attempt = task.retry_count + 1;
    // ERROR level so the span (and its fields) is enabled under any filter
    // that lets a line through: every line about a task names it.
    let span = tracing::error_span!(
        "task",
        task_id = task.id,
        task_type = %task.task_type,
        attempt
    );
    async move {
        shared.in_flight.insert(task.id, task.claims);
        let task_type: Arc<str> = Arc::from(task.task_type.as_str());
        let started = std::time::Instant::now();
        let result = run_handler(&shared, &task, Arc::clone(&task_type), attempt).await;
        metrics::histogram!(HANDLER_DURATION, "task_type" => Arc::clone(&task_type))
            .record(started.elapsed().as_secs_f64());
        shared.in_flight.remove(task.id);
        let Some(result) = result else {
            // Aborted at the end of a shutdown; the task was released.
            return;
        };
        let (finish, kind) = outcome_to_finish(&shared, &task, result);
        match kind {
            TaskEventKind::Completed => tracing::debug!("task completed"),
            TaskEventKind::Snoozed => tracing::debug!("task snoozed"),
            TaskEventKind::Released => tracing::info!("task released at shutdown"),
            _ => tracing::warn!(error = finish.error.as_deref().unwrap_or(""), outcome = ?kind, "task failed"),
        }
        if done.send(Done { finish, kind, task_type }).await.is_err() {
            tracing::error!("completer is gone; the outcome is left to recovery");
        }
        drop(permit);
    }
    .instrument(span)
    .await;
}

/// Calls the handler; `None` when it was aborted by shutdown.
async fn run_handler(
    shared: &Shared,
    task: &ClaimedTask,
    task_type: Arc<str>,
    attempt: i32,
) -> Option<Result<Outcome, String>> {
    let Some(entry) = shared.handlers.get(&task.task_type) else {
        return Some(Err(format!(
            "no handler for task type {:?} in this worker (it handles: {}); \
             deploy a worker that registers one, then retry the task",
            task.task_type,
            shared.handlers.known_types()
        )));
    };
    let ctx = TaskContext {
        id: TaskId(task.id),
        task_type,
        queue: Arc::from(task.queue.as_str()),
        attempt,
        max_attempts: task.max_attempts,
        cancel: shared.handler_cancel.child_token(),
        pool: shared.pool.clone(),
    };
    let future = match entry.handler.start(ctx, &task.payload) {
        Ok(f) => f,
        Err(decode_error) => return Some(Err(decode_error)),
    };
    // Its own tokio task, so a panic fails this attempt instead of the
    // worker, and shutdown can abort it.
    let handle = tokio::spawn(future.instrument(tracing::Span::current()));
    shared.in_flight.set_abort(task.id, handle.abort_handle());
    match handle.await {
        Ok(Ok(outcome)) => Some(Ok(outcome)),
        Ok(Err(error)) => Some(Err(error.message().to_owned())),
        Err(e) if e.is_cancelled() => None,
        Err(e) => Some(Err(format!(
            "handler panicked: {}",
            panic_message(&*e.into_panic())
        ))),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

fn outcome_to_finish(
    shared: &Shared,
    task: &ClaimedTask,
    result: Result<Outcome, String>,
) -> (Finish, TaskEventKind) {
    let base = Finish {
        id: task.id,
        claims: task.claims,
        state: NextState::Completed,
        add_retry: 0,
        delay_us: 0,
        dead: false,
        error: None,
    };
    if shared.handler_cancel.is_cancelled() && !matches!(result, Ok(Outcome::Success)) {
        // The handler stopped because shutdown cancelled it, not because
        // the task failed: put it back without counting an attempt.
        let finish = Finish {
            state: NextState::Pending,
            ..base
        };
        return (finish, TaskEventKind::Released);
    }
    match result {
        Ok(Outcome::Success) => (base, TaskEventKind::Completed),
        Ok(Outcome::RetryAfter(delay)) => (
            Finish {
                state: NextState::Pending,
                delay_us: clamped_delay_micros(delay),
                ..base
            },
            TaskEventKind::Snoozed,
        ),
        Ok(Outcome::GiveUp(reason)) => (
            Finish {
                state: NextState::Failed,
                add_retry: 1,
                dead: true,
                error: Some(storable(reason)),
                ..base
            },
            TaskEventKind::Dead,
        ),
        Err(error) => {
            let dead = task.retry_count + 1 >= task.max_attempts;
            let table = shared.handlers.retry_delays(&task.task_type);
            let delay = delay_after_failure(table, task.retry_count);
            let finish = Finish {
                state: NextState::Failed,
                add_retry: 1,
                delay_us: if dead { 0 } else { clamped_delay_micros(delay) },
                dead,
                error: Some(storable(error)),
                ..base
            };
            (
                finish,
                if dead {
                    TaskEventKind::Dead
                } else {
                    TaskEventKind::Failed
                },
            )
        }
    }
}

/// Longest error message kept on a row.
const MAX_ERROR_BYTES: usize = 16 * 1024;

/// An error message PostgreSQL will store: no NUL bytes (text cannot hold
/// them, and one would make the whole outcome unwritable), and bounded.
fn storable(mut message: String) -> String {
    if message.contains('\0') {
        message = message.replace('\0', "\u{FFFD}");
    }
    if message.len() > MAX_ERROR_BYTES {
        let mut end = MAX_ERROR_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("... (truncated)");
    }
    message
}

/// At the end of the grace period: aborts every running handler and puts
/// its task back to PENDING without counting an attempt, so another worker
/// takes it at once.
pub(crate) async fn release_unfinished(shared: &Shared) {
    let running = shared.in_flight.drain();
    if running.is_empty() {
        return;
    }
    let mut batch = Vec::with_capacity(running.len());
    for (id, claims, abort) in running {
        if let Some(abort) = abort {
            abort.abort();
        }
        batch.push(Finish {
            id,
            claims,
            state: NextState::Pending,
            add_retry: 0,
            delay_us: 0,
            dead: false,
            error: None,
        });
    }
    let refs: Vec<&Finish> = batch.iter().collect();
    for attempt in 1..=5 {
        match db::finish_tasks(&shared.pool, &refs, shared.config.clock.now()).await {
            Ok(ids) => {
                tracing::info!(released = ids.len(), "released unfinished tasks");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, attempt, "could not release unfinished tasks");
                tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
            }
        }
    }
    tracing::error!("unfinished tasks stay PROCESSING; stuck-task recovery will return them");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_are_made_storable() {
        assert_eq!(storable("plain".into()), "plain");
        assert_eq!(storable("nul\0here".into()), "nul\u{FFFD}here");
        let long = "é".repeat(MAX_ERROR_BYTES);
        let kept = storable(long);
        assert!(kept.len() <= MAX_ERROR_BYTES + 20 && kept.ends_with("... (truncated)"));
    }
}
