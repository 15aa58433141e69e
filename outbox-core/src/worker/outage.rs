//! Logs a database outage once when it starts and once when it ends, not
//! on every failed poll, and paces the retries.

use std::time::{Duration, Instant};

/// Tracks one component's view of the database.
#[derive(Debug)]
pub(crate) struct Outage {
    what: &'static str,
    since: Option<Instant>,
    failures: u32,
}

impl Outage {
    pub(crate) fn new(what: &'static str) -> Self {
        Self {
            what,
            since: None,
            failures: 0,
        }
    }

    /// Records a failure and returns how long to wait before trying again
    /// (exponential from 50 ms to 5 s).
    pub(crate) fn failed(&mut self, error: &sqlx::Error) -> Duration {
        if self.since.is_none() {
            self.since = Some(Instant::now());
            tracing::warn!(component = self.what, %error, "database unavailable; retrying with backoff");
        }
        self.failures = self.failures.saturating_add(1);
        let exp = self.failures.min(7);
        Duration::from_millis(50 * (1 << exp)).min(Duration::from_secs(5))
    }

    /// Records a success, logging the end of an outage.
    pub(crate) fn ok(&mut self) {
        if let Some(since) = self.since.take() {
            tracing::info!(
                component = self.what,
                down_for_ms = since.elapsed().as_millis() as u64,
                "database reachable again"
            );
        }
        self.failures = 0;
    }
}
