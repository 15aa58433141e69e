//! Runs one claimed attempt: decode, call the handler with no transaction
//! or lock held, and turn its result into the outcome TX2 will write.

use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::Instrument;

use super::Shared;
use super::claim_ahead::{Places, WaitingRun};
use super::events::TaskEventKind;
use super::holdings::BeforeStart;
use crate::db::{ClaimedTask, Finish, NextState};
use crate::handler::{Outcome, TaskContext};
use crate::options::clamped_delay_micros;
use crate::retry::{delay_after_failure, jittered};
use crate::task::TaskId;

/// Histogram of handler run time in seconds, by task type.
pub(crate) const HANDLER_DURATION: &str = "outbox_handler_duration_seconds";

/// An outcome on its way to the completer.
#[derive(Debug)]
pub(crate) struct Done {
    pub(crate) finish: Finish,
    pub(crate) kind: TaskEventKind,
    pub(crate) task_type: Arc<str>,
    /// The task's queue: counted in the throughput, and woken when an
    /// outcome makes the task due again later (a retry's backoff, a snooze).
    pub(crate) queue: Arc<str>,
    /// The handler completed the task in its own transaction
    /// ([`TaskContext::complete_in`]): if this outcome finds the row no
    /// longer held, that is why, and the task is completed.
    pub(crate) completed_in: bool,
    /// The task has an ordering key: once its outcome is written, the
    /// next task of the key may be claimable.
    pub(crate) ordered: bool,
    /// The workflow the task is a step of, if known: picks its outcome lane.
    pub(crate) workflow_id: Option<i64>,
    /// The rest of the task's run (its key's tasks claimed with it), and
    /// the place in the queue's capacity they go on with (see
    /// worker/runs.rs).
    pub(crate) run: Option<(Vec<ClaimedTask>, WaitingRun)>,
}

/// Runs one attempt (already recorded in the worker's holdings by the
/// producer) and queues its outcome. The places (the executor slot and the
/// place in the queue's capacity) are held until the outcome is queued, so
/// a slow completer slows claiming instead of piling up outcomes in memory.
/// A task of a run frees its slot as soon as its handler is done and keeps
/// its place for the run's next task (see [`WaitingRun`]).
pub(crate) async fn execute(
    shared: Arc<Shared>,
    mut task: ClaimedTask,
    done: mpsc::Sender<Done>,
    permit: Places,
) {
    // Held with the task; started, or given back, once its outcome is
    // written (worker/runs.rs).
    let run = std::mem::take(&mut task.run);
    let attempt = task.retry_count + 1;
    // ERROR level so the span (and its fields) is enabled under any filter
    // that lets a line through: every line about a task names it.
    let span = tracing::error_span!(
        "task",
        task_id = task.id,
        task_type = %task.task_type,
        queue = %task.queue,
        attempt,
        // Its name and kind in an OpenTelemetry trace (`otel` feature).
        otel.name = %format_args!("{} process", task.task_type),
        otel.kind = "consumer",
    );
    // The submitter's span is this one's parent, across processes.
    #[cfg(feature = "otel")]
    if let Some(traceparent) = &task.trace_context {
        crate::trace::continue_trace(&span, traceparent);
    }
    async move {
        let task_type: Arc<str> = Arc::from(task.task_type.as_str());
        // Shared by the handler's context and the outcome: one allocation.
        let queue: Arc<str> = Arc::from(task.queue.as_str());
        let started = std::time::Instant::now();
        let completed_in = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // A task of a run was claimed before it started: its outcome says
        // when it did (migration 28).
        let mut started_at = None;
        // A task claimed ahead and let go of before its slot came never
        // starts (see worker/heartbeat.rs), nor does one cancelled meanwhile.
        let result = match shared.holdings.before_start(task.id, &task.token) {
            BeforeStart::LetGo => None,
            // Cancelled by an operator while it waited for its slot (claimed
            // ahead, or behind its run's head): its handler never starts,
            // and its outcome below says so. (One that comes between here
            // and the handler's start fires its token at once.)
            BeforeStart::Cancelled => {
                tracing::info!("task cancelled before it started; not running it");
                Some(Ok(Outcome::GiveUp(CANCELLED.to_owned())))
            }
            BeforeStart::Run => {
            if task.follows {
                started_at = Some(shared.config.clock.now().unwrap_or_else(chrono::Utc::now));
            }
            run_handler(
                &shared,
                &task,
                Arc::clone(&task_type),
                Arc::clone(&queue),
                attempt,
                &completed_in,
            )
            .await
            }
        };
        metrics::histogram!(HANDLER_DURATION, "task_type" => Arc::clone(&task_type))
            .record(started.elapsed().as_secs_f64());
        let let_go = shared.holdings.ran(task.id, &task.token);
        let result = match result {
            Some(result) => result,
            // Let go of: put back below, whether it was aborted or never ran.
            None if let_go => Err(LET_GO.to_owned()),
            // Aborted at the end of a shutdown: the task stays held and is
            // released with the rest.
            None => return,
        };
        // An operator's cancel wins over whatever the handler said, except
        // a success, which the database judges as it writes it: a workflow
        // step's is recorded (its work is done, and done its saga
        // compensates it: migration 48), any other task ends dead as here.
        // The worker cannot tell: a step handed on by its key comes
        // without its workflow.
        let succeeded = matches!(result, Ok(Outcome::Success | Outcome::SuccessWith(_)));
        let result = if shared.holdings.cancel_requested(task.id) && !succeeded {
            Ok(Outcome::GiveUp(CANCELLED.to_owned()))
        } else {
            result
        };
        let (finish, kind) = outcome_to_finish(&shared, &task, result, let_go, started_at);
        match kind {
            TaskEventKind::Completed => tracing::debug!("task completed"),
            TaskEventKind::Snoozed => tracing::debug!("task snoozed"),
            TaskEventKind::Released if let_go => {
                tracing::warn!("task stopped: this worker let go of it; releasing it");
            }
            TaskEventKind::Released => tracing::info!("task stopped at shutdown; releasing it"),
            _ => tracing::warn!(error = finish.error.as_deref().unwrap_or(""), outcome = ?kind, "task failed"),
        }
        // A run keeps its place in the capacity for its next task; the slot
        // is free now.
        let (run, permit) = if run.is_empty() {
            (None, Some(permit))
        } else {
            (Some((run, permit.wait_for_outcome())), None)
        };
        let done_msg = Done {
            finish,
            kind,
            task_type,
            queue,
            completed_in: completed_in.load(std::sync::atomic::Ordering::SeqCst),
            ordered: task.ordered,
            workflow_id: task.workflow_id,
            run,
        };
        if done.send(done_msg).await.is_err() {
            tracing::error!("completer is gone; the task is released at exit");
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
    queue: Arc<str>,
    attempt: i32,
    completed_in: &Arc<std::sync::atomic::AtomicBool>,
) -> Option<Result<Outcome, String>> {
    let Some(entry) = shared.handlers.get(&task.task_type) else {
        return Some(Err(format!(
            "no handler for task type {:?} in this worker (it handles: {}); \
             deploy a worker that registers one, then retry the task",
            task.task_type,
            shared.handlers.known_types()
        )));
    };
    let cancel = shared.handler_cancel.child_token();
    let ctx = TaskContext {
        id: TaskId(task.id),
        task_type,
        queue,
        attempt,
        max_attempts: task.max_attempts,
        cancel: cancel.clone(),
        pool: shared.pool.clone(),
        claim: Some((task.claims, Arc::clone(&task.token))),
        completed_in: Arc::clone(completed_in),
        key_seq: task.key_seq,
        created_at: task.created_at,
    };
    let future = match entry.handler.start(ctx, &task.payload) {
        Ok(f) => f,
        // No attempt can make these bytes decode into this type: dead now,
        // with the reason, rather than ten attempts over a day.
        Err(decode_error) => {
            return Some(Ok(Outcome::GiveUp(format!(
                "{decode_error}; no retry can fix this payload, so the task is dead at once"
            ))));
        }
    };
    // Its own tokio task, so a panic fails this attempt instead of the
    // worker, and shutdown can abort it.
    let mut handle = tokio::spawn(future.instrument(tracing::Span::current()));
    shared.holdings.running(
        task.id,
        &task.token,
        handle.abort_handle(),
        cancel.clone(),
        Arc::clone(completed_in),
    );
    let joined = match entry.timeout {
        None => handle.await,
        Some(limit) => match tokio::time::timeout(limit, &mut handle).await {
            Ok(joined) => joined,
            Err(_) => {
                // Out of time: ask the handler to stop, give it the cancel
                // grace, then abort it. Whatever it returns now, the
                // attempt timed out.
                cancel.cancel();
                if tokio::time::timeout(shared.config.cancel_grace, &mut handle)
                    .await
                    .is_err()
                {
                    handle.abort();
                }
                return Some(Err(format!("timed out after {}", short_duration(limit))));
            }
        },
    };
    match joined {
        Ok(Ok(outcome)) => Some(Ok(outcome)),
        // A durable sleep: run again later, without counting an attempt.
        Ok(Err(error)) if error.suspended_for().is_some() => Some(Ok(Outcome::RetryAfter(
            error.suspended_for().unwrap_or_default(),
        ))),
        Ok(Err(error)) => Some(Err(error.message().to_owned())),
        Err(e) if e.is_cancelled() => None,
        Err(e) => Some(Err(format!(
            "handler panicked: {}",
            panic_message(&*e.into_panic())
        ))),
    }
}

/// `30s`, `1500ms`: how a timeout was declared.
fn short_duration(d: std::time::Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// The outcome of `result`; `let_go`: the worker let go of the attempt
/// (its hold could not be vouched for).
fn outcome_to_finish(
    shared: &Shared,
    task: &ClaimedTask,
    result: Result<Outcome, String>,
    let_go: bool,
    started_at: Option<chrono::DateTime<chrono::Utc>>,
) -> (Finish, TaskEventKind) {
    let base = Finish {
        started_at,
        id: task.id,
        claims: task.claims,
        token: Arc::clone(&task.token),
        state: NextState::Completed,
        add_retry: 0,
        delay_us: 0,
        dead: false,
        error: None,
        result: None,
    };
    if (shared.handler_cancel.is_cancelled() || let_go)
        && !matches!(result, Ok(Outcome::Success | Outcome::SuccessWith(_)))
    {
        // The handler stopped because shutdown cancelled it or the worker
        // let go of the task, not because the task failed: put it back
        // without counting an attempt (a task taken over meanwhile fences
        // this out).
        let finish = Finish {
            state: NextState::Pending,
            ..base
        };
        return (finish, TaskEventKind::Released);
    }
    match result {
        Ok(Outcome::Success) => (base, TaskEventKind::Completed),
        Ok(Outcome::SuccessWith(value)) => (
            Finish {
                result: Some(value.to_string()),
                ..base
            },
            TaskEventKind::Completed,
        ),
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
            let delay = jittered(
                delay_after_failure(table, task.retry_count),
                shared.config.retry_jitter_percent,
            );
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

/// The last error of a task an operator cancelled (the database writes the
/// same when it finds the request first).
const CANCELLED: &str = "cancelled by an operator";

/// Why an attempt the worker let go of ended (never written: the task is
/// put back, see `outcome_to_finish`).
const LET_GO: &str = "let go of: this worker could not vouch for its hold";

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
