//! Committed outcomes, broadcast to whoever subscribed (tests, benchmarks,
//! progress bars): a signal to wait on instead of polling the table.

use crate::task::TaskId;

/// An outcome of one attempt that the worker has committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEvent {
    /// The task.
    pub id: TaskId,
    /// Its task type.
    pub task_type: String,
    /// What was written.
    pub kind: TaskEventKind,
}

/// The kinds of committed outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TaskEventKind {
    /// COMPLETED.
    Completed,
    /// FAILED with attempts left: it will run again at its execute_at.
    Failed,
    /// FAILED with no attempts left (or given up): waits for an operator.
    Dead,
    /// Put back to run later without counting an attempt.
    Snoozed,
    /// Put back at shutdown because it did not finish within the grace
    /// period.
    Released,
    /// Not written: the task had been recovered and claimed again since this
    /// attempt started, so its outcome belongs to the newer attempt.
    Stale,
}

impl TaskEventKind {
    /// The outcome's name in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskEventKind::Completed => "completed",
            TaskEventKind::Failed => "failed",
            TaskEventKind::Dead => "dead",
            TaskEventKind::Snoozed => "snoozed",
            TaskEventKind::Released => "released",
            TaskEventKind::Stale => "stale",
        }
    }
}
