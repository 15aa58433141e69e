//! Counters of a worker's own work: how many statements it sent and how many
//! tasks they carried. Cheap atomics, read by benchmarks and diagnostics to
//! report round trips per task.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters of one worker; read them with [`WorkerCounters::snapshot`].
#[derive(Debug, Default)]
pub struct WorkerCounters {
    claim_queries: AtomicU64,
    tasks_claimed: AtomicU64,
    finish_queries: AtomicU64,
    outcomes_written: AtomicU64,
    heartbeat_queries: AtomicU64,
    tasks_handed_on: AtomicU64,
    tasks_run_on: AtomicU64,
    keys_deferred: AtomicU64,
}

/// A copy of [`WorkerCounters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CountersSnapshot {
    /// Claim statements (TX1) sent, including ones that found nothing.
    pub claim_queries: u64,
    /// Tasks those claims returned.
    pub tasks_claimed: u64,
    /// Outcome statements (TX2) sent.
    pub finish_queries: u64,
    /// Outcomes those statements carried.
    pub outcomes_written: u64,
    /// Heartbeat statements sent.
    pub heartbeat_queries: u64,
    /// Tasks claimed by an outcome statement that handed their ordering
    /// key straight on to them (no claim statement of their own); the
    /// tasks of the run claimed behind each are counted in `tasks_run_on`
    /// only.
    pub tasks_handed_on: u64,
    /// Tasks claimed in a run behind an earlier task of their ordering key
    /// (by a claim, and then counted among `tasks_claimed` too, or by a
    /// hand-on) that started once it was done, without a hand-over between
    /// them.
    pub tasks_run_on: u64,
    /// Ordering keys an outcome let go of but could not hand on in its own
    /// statement, another transaction holding the key's lock: each was
    /// handed on by a statement of its own once the lock was free.
    pub keys_deferred: u64,
}

impl CountersSnapshot {
    /// Statements sent on the hot path (claims, outcomes, heartbeats).
    pub fn round_trips(&self) -> u64 {
        self.claim_queries + self.finish_queries + self.heartbeat_queries
    }
}

impl WorkerCounters {
    /// The current values.
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            claim_queries: self.claim_queries.load(Ordering::Relaxed),
            tasks_claimed: self.tasks_claimed.load(Ordering::Relaxed),
            finish_queries: self.finish_queries.load(Ordering::Relaxed),
            outcomes_written: self.outcomes_written.load(Ordering::Relaxed),
            heartbeat_queries: self.heartbeat_queries.load(Ordering::Relaxed),
            tasks_handed_on: self.tasks_handed_on.load(Ordering::Relaxed),
            tasks_run_on: self.tasks_run_on.load(Ordering::Relaxed),
            keys_deferred: self.keys_deferred.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn claimed(&self, tasks: usize) {
        self.claim_queries.fetch_add(1, Ordering::Relaxed);
        self.tasks_claimed
            .fetch_add(tasks as u64, Ordering::Relaxed);
    }

    pub(crate) fn finished(&self, outcomes: usize) {
        self.finish_queries.fetch_add(1, Ordering::Relaxed);
        self.outcomes_written
            .fetch_add(outcomes as u64, Ordering::Relaxed);
    }

    pub(crate) fn handed_on(&self, tasks: usize) {
        self.tasks_handed_on
            .fetch_add(tasks as u64, Ordering::Relaxed);
    }

    pub(crate) fn run_on(&self) {
        self.tasks_run_on.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn deferred(&self, keys: usize) {
        self.keys_deferred.fetch_add(keys as u64, Ordering::Relaxed);
    }

    pub(crate) fn heartbeat(&self) {
        self.heartbeat_queries.fetch_add(1, Ordering::Relaxed);
    }
}
