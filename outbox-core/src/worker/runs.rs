//! Runs: a claim that takes the next task of an ordering key also takes up
//! to `key_run - 1` tasks waiting behind it, in key order (migration 28),
//! and so does an outcome that hands a key on to its next task (migration
//! 46). They stay blocked in the database, so no claim can take them: the
//! run's last task is written PROCESSING and holds the key until the run
//! ends, so no hand-over gives the key to another task while the run goes
//! on, and those between are held in place without a write (migration 56:
//! the last task says where the run starts, and their outcomes are checked
//! against it; builds before it wrote the claim on each, migration 43).
//!
//! Here they go on one at a time: a task's run travels with it (with its
//! place in the queue's capacity) to its outcome, and only once that
//! outcome has committed as done does the next task go to the queue's
//! dispatcher, with the rest of the run. So a key's tasks start in key
//! order and never before the one ahead has committed, as when the key is
//! handed on, but without a hand-over between them: the outcome says its
//! key goes on here (`continuing`, with the next task: the run goes on
//! only while that task is still this worker's, and stuck-task recovery
//! takes a run back only whole), and only the run's last task lets go of
//! it. That task may hand the key straight on to its next run, claimed by
//! its outcome for this worker when a slot is idle (worker/hand_on.rs);
//! otherwise the key's next task goes back to its line, and the queue's
//! producer, woken, claims it with the next run.
//!
//! Any other end gives the rest of the run back (PENDING, no attempt
//! counted): a failure, a snooze, a cancel seen here, a stale or rejected
//! outcome, a task completed in its handler's own transaction, a queue
//! paused or given limits since the claim, or a worker that stopped
//! claiming. The release (release_run.sql) hands the key to the first task
//! left in its line when nothing holds it, waiting for the key's lock as
//! an outcome does (50 ms, then the key is owed a hand-over). An outcome
//! not written by the flush deadline leaves its run held: released at
//! exit, or recovered.

use super::events::TaskEventKind;
use super::executor::Done;

/// What becomes of the rest of a run once its task's outcome is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// The task is done: the next one starts.
    GoOn,
    /// Give the rest back.
    GiveBack,
    /// The outcome is not written: the run stays held with the task.
    Hold,
}

/// How the outcome of `d` was settled: `written` (as the handler said),
/// `unwritten` (not by the flush deadline).
pub(crate) fn next(d: &Done, written: bool, unwritten: bool) -> Next {
    if unwritten {
        Next::Hold
    } else if written && d.kind == TaskEventKind::Completed {
        Next::GoOn
    } else {
        // Not completed here. A task completed by its handler's own
        // transaction (`complete_in`) is no exception: its outcome cannot
        // tell that transaction committed from the task taken over by
        // another worker, and the run's next task must not start before
        // its task is known done.
        Next::GiveBack
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{Next, next};
    use crate::db::{Finish, NextState};
    use crate::worker::events::TaskEventKind;
    use crate::worker::executor::Done;

    fn done(kind: TaskEventKind, completed_in: bool) -> Done {
        Done {
            finish: Finish {
                id: 1,
                claims: 1,
                token: Arc::from("w/1"),
                state: NextState::Completed,
                add_retry: 0,
                delay_us: 0,
                dead: false,
                error: None,
                result: None,
                started_at: None,
            },
            kind,
            task_type: Arc::from("t"),
            queue: Arc::from("q"),
            completed_in,
            ordered: true,
            workflow_id: None,
            run: None,
        }
    }

    #[test]
    fn a_run_goes_on_only_after_its_task_is_done() {
        use TaskEventKind::*;
        assert_eq!(next(&done(Completed, false), true, false), Next::GoOn);
        // Completed in the handler's transaction, or so it seemed: the
        // outcome found the row no longer held, which proves neither.
        assert_eq!(next(&done(Completed, true), false, false), Next::GiveBack);
        // Fenced out: another attempt has the task now.
        assert_eq!(next(&done(Completed, false), false, false), Next::GiveBack);
        for kind in [Failed, Dead, Snoozed, Released] {
            assert_eq!(
                next(&done(kind, false), true, false),
                Next::GiveBack,
                "{kind:?}"
            );
        }
        assert_eq!(next(&done(Completed, false), false, true), Next::Hold);
    }
}
