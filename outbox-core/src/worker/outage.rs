//! Logs a database outage once when it starts and once when it ends, not
//! on every failed attempt, and paces the retries with jittered backoff.

use std::time::{Duration, Instant};

use crate::db::classify::is_transient;

/// The first retry waits about this long; each further one twice as long.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// No retry waits longer than this.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

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

    /// Records a failure and returns how long to wait before trying again:
    /// exponential from 50 ms to 5 s, each wait drawn between half and all
    /// of that so that workers that failed together do not retry together.
    /// A permanent error is logged every time (it is a bug or bad data,
    /// not weather); a transient one only when an outage starts.
    pub(crate) fn failed(&mut self, error: &sqlx::Error) -> Duration {
        if !is_transient(error) {
            tracing::error!(component = self.what, %error, "the database rejected a statement; retrying with backoff");
        } else if self.since.is_none() {
            tracing::warn!(component = self.what, %error, "database unavailable; retrying with backoff");
        }
        self.since.get_or_insert_with(Instant::now);
        self.failures = self.failures.saturating_add(1);
        jittered(backoff(self.failures))
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

/// The backoff ceiling after `failures` failures in a row.
fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    FIRST_BACKOFF.saturating_mul(1 << exp).min(MAX_BACKOFF)
}

/// A duration between half of `ceiling` and all of it.
fn jittered(ceiling: Duration) -> Duration {
    let random = crate::random::u64();
    let half = ceiling / 2;
    half + half.mul_f64((random % 1024) as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_ceiling_and_jitter_stays_within_it() {
        assert_eq!(backoff(1), Duration::from_millis(50));
        assert_eq!(backoff(2), Duration::from_millis(100));
        assert_eq!(backoff(8), Duration::from_millis(5000));
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
        for failures in [1, 3, 40] {
            let ceiling = backoff(failures);
            let d = jittered(ceiling);
            assert!(d >= ceiling / 2 && d <= ceiling, "{d:?} of {ceiling:?}");
        }
    }
}
