//! Which queues a submit NOTIFYs.
//!
//! PostgreSQL makes every transaction that sent a NOTIFY take one global
//! lock from just before its commit until after it, so notifying commits are
//! flushed one at a time instead of together: with NOTIFY on every submit,
//! single-task submits from many clients top out at the rate of one WAL
//! flush after another. So each process notifies a queue at most once per
//! [`NOTIFY_DEBOUNCE`]. A task submitted within that window is still found
//! at once by a busy worker (after a claim that found work, a worker polls
//! again within [`crate::WorkerConfig::busy_poll_interval`]) and, in any
//! case, by the fallback poll: NOTIFY is an optimisation, the poll is the
//! guarantee.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;

use crate::db::NewTask;

/// The shortest time between two NOTIFYs of one queue from one process.
pub const NOTIFY_DEBOUNCE: Duration = Duration::from_millis(5);

/// When this process last notified each queue.
static LAST_NOTIFY: LazyLock<Mutex<HashMap<String, Instant>>> = LazyLock::new(Mutex::default);

/// The queues to notify for `rows`: those with a task due now that were not
/// notified within the debounce window. Records them as notified.
pub(crate) fn queues_to_notify(rows: &[NewTask]) -> Vec<String> {
    let now = Instant::now();
    let wall = Utc::now();
    let mut last = LAST_NOTIFY.lock().unwrap_or_else(|e| e.into_inner());
    let mut queues = Vec::new();
    for row in rows {
        let due_now = row.delay_us.is_none_or(|d| d <= 0) && row.run_at.is_none_or(|at| at <= wall);
        if !due_now || queues.contains(&row.queue) {
            continue;
        }
        let recent = last
            .get(&row.queue)
            .is_some_and(|at| now.duration_since(*at) < NOTIFY_DEBOUNCE);
        if !recent {
            last.insert(row.queue.clone(), now);
            queues.push(row.queue.clone());
        }
    }
    queues
}
