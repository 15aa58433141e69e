//! How long a partition's lease surely lasts, on this process's clock.
//!
//! The database decides when a lease runs out (`lease_until`, its clock).
//! This side counts from the moment it *sent* the renewal, which is before
//! the database stamped it, and keeps a margin: so while this clock says
//! "held", no other relay worker can have taken the partition, even if this
//! process was paused or cut off meanwhile. Nothing is published past it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// A lease's end as this process knows it.
pub(crate) struct LeaseClock {
    base: Instant,
    /// Milliseconds after `base` until which the lease is held.
    until_ms: AtomicU64,
    ttl: Duration,
}

impl LeaseClock {
    /// A lease of `ttl` renewed at `sent`.
    pub(crate) fn new(ttl: Duration, sent: Instant) -> Self {
        let clock = Self {
            base: sent,
            until_ms: AtomicU64::new(0),
            ttl,
        };
        clock.renewed(sent);
        clock
    }

    /// A renewal sent at `sent` succeeded.
    pub(crate) fn renewed(&self, sent: Instant) {
        // A fifth of the lease is the margin for clock drift and the time
        // a publish already under way may still take.
        let until = sent + self.ttl - self.ttl / 5;
        let ms = until.saturating_duration_since(self.base).as_millis() as u64;
        self.until_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// Whether the lease is surely still held.
    pub(crate) fn held(&self) -> bool {
        let now = Instant::now()
            .saturating_duration_since(self.base)
            .as_millis() as u64;
        now < self.until_ms.load(Ordering::Acquire)
    }

    /// Whether it is time to renew (a third of the lease has gone by since
    /// the last renewal).
    pub(crate) fn due(&self) -> bool {
        let now = Instant::now()
            .saturating_duration_since(self.base)
            .as_millis() as u64;
        let until = self.until_ms.load(Ordering::Acquire);
        let renew_at =
            until.saturating_sub((self.ttl - self.ttl / 5 - self.ttl / 3).as_millis() as u64);
        now >= renew_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn held_until_four_fifths_of_the_lease_and_due_after_a_third() {
        let ttl = Duration::from_secs(10);
        let clock = LeaseClock::new(ttl, Instant::now());
        assert!(clock.held() && !clock.due());
        tokio::time::advance(Duration::from_millis(3400)).await;
        assert!(clock.held() && clock.due());
        tokio::time::advance(Duration::from_millis(4700)).await;
        assert!(!clock.held());
        clock.renewed(Instant::now());
        assert!(clock.held() && !clock.due());
    }
}
