//! The relay's circuit breaker: after enough transient failures in a row
//! the broker is presumed down, and handlers wait at the gate instead of
//! publishing. Waiting handlers hold the relay's concurrency, so the
//! relay stops claiming; after a cool-down one probe goes through, and its
//! success closes the circuit.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Transient failures in a row that open the circuit.
pub(crate) const OPEN_AFTER: u32 = 5;
const COOL_DOWN_MIN: Duration = Duration::from_millis(500);
const COOL_DOWN_MAX: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
        cool_down: Duration,
    },
    /// One probe is out; it was let through at `since`.
    HalfOpen {
        since: Instant,
        cool_down: Duration,
    },
}

/// What the gate says to a handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Publish.
    Go,
    /// Still open after the longest wait: put the event back for this long.
    Later(Duration),
}

/// How often the first failure of a streak is logged at WARN, at most.
const FIRST_FAILURE_WARNING: Duration = Duration::from_secs(60);

pub(crate) struct Circuit {
    /// The relay it guards, for the log.
    relay: std::sync::Arc<str>,
    phase: Mutex<Phase>,
    /// When the first failure of a streak was last logged at WARN.
    warned_at: Mutex<Option<Instant>>,
    /// Since when publishes have failed with no success since, and the
    /// last reason: what the relay's word of being alive says of its
    /// broker (`failing`).
    failing: Mutex<Option<(Instant, String)>>,
    changed: Notify,
    /// How long a probe may take before another is let through.
    probe_timeout: Duration,
}

impl Circuit {
    pub(crate) fn new(relay: std::sync::Arc<str>, probe_timeout: Duration) -> Self {
        Self {
            relay,
            phase: Mutex::new(Phase::Closed { failures: 0 }),
            warned_at: Mutex::new(None),
            failing: Mutex::new(None),
            changed: Notify::new(),
            probe_timeout,
        }
    }

    /// True while the circuit is open or probing.
    pub(crate) fn is_open(&self) -> bool {
        !matches!(*self.lock(), Phase::Closed { .. })
    }

    /// Waits at most `max_wait` to be let through.
    pub(crate) async fn admit(&self, max_wait: Duration) -> Admit {
        let deadline = Instant::now() + max_wait;
        loop {
            let notified = self.changed.notified();
            let wake_at = {
                let mut phase = self.lock();
                let now = Instant::now();
                match *phase {
                    Phase::Closed { .. } => return Admit::Go,
                    Phase::Open { until, cool_down } if now >= until => {
                        *phase = Phase::HalfOpen {
                            since: now,
                            cool_down,
                        };
                        return Admit::Go;
                    }
                    Phase::HalfOpen { since, cool_down } if now >= since + self.probe_timeout => {
                        // The probe never reported (its attempt was dropped):
                        // let another through.
                        *phase = Phase::HalfOpen {
                            since: now,
                            cool_down,
                        };
                        return Admit::Go;
                    }
                    Phase::Open { until, .. } => until,
                    Phase::HalfOpen { since, .. } => since + self.probe_timeout,
                }
            };
            if Instant::now() >= deadline {
                return Admit::Later(wake_at.saturating_duration_since(Instant::now()));
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(wake_at.min(deadline)) => {}
            }
        }
    }

    /// How long publishes have failed with no success since, and the last
    /// reason; none while they succeed.
    pub(crate) fn failing(&self) -> Option<(Duration, String)> {
        let failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        failing
            .as_ref()
            .map(|(since, why)| (since.elapsed(), why.clone()))
    }

    /// The broker took a message, or answered at all: close.
    pub(crate) fn success(&self) {
        let mut phase = self.lock();
        // Every failure leaves the phase away from this, so the check that
        // every publish makes stays one comparison.
        if *phase != (Phase::Closed { failures: 0 }) {
            let was_open = !matches!(*phase, Phase::Closed { .. });
            *phase = Phase::Closed { failures: 0 };
            *self.failing.lock().unwrap_or_else(|p| p.into_inner()) = None;
            drop(phase);
            if was_open {
                tracing::info!(relay = %self.relay, "relay circuit closed: the broker answers again");
            }
            self.changed.notify_waiters();
        }
    }

    /// A transient failure, `why` (said when it opens the circuit: the
    /// failures' reasons are otherwise logged at debug level only). Returns
    /// how many there have been in a row (for the caller's backoff).
    pub(crate) fn failure(&self, why: &str) -> u32 {
        let mut phase = self.lock();
        let now = Instant::now();
        let (next, streak) = match *phase {
            Phase::Closed { failures } if failures + 1 < OPEN_AFTER => (
                Phase::Closed {
                    failures: failures + 1,
                },
                failures + 1,
            ),
            Phase::Closed { .. } => (
                Phase::Open {
                    until: now + COOL_DOWN_MIN,
                    cool_down: COOL_DOWN_MIN,
                },
                OPEN_AFTER,
            ),
            Phase::HalfOpen { cool_down, .. } => {
                let cool_down = (cool_down * 2).min(COOL_DOWN_MAX);
                (
                    Phase::Open {
                        until: now + cool_down,
                        cool_down,
                    },
                    OPEN_AFTER,
                )
            }
            // Failures of publishes that started before it opened.
            open @ Phase::Open { .. } => (open, OPEN_AFTER),
        };
        {
            let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
            match &mut *failing {
                Some((_, last)) => why.clone_into(last),
                None => *failing = Some((now, why.to_owned())),
            }
        }
        // Once per outage: a probe that fails reopens the circuit quietly.
        match (&*phase, &next) {
            // The first failure after a success: an outage may start here.
            // A publish timing out takes the relay's timeout (10 s by
            // default) to fail, and the circuit opens after five in a row,
            // so without this an outage of half a minute would leave no
            // trace at WARN. Once a minute at most: a broker that fails
            // now and then (429s) would fill the log.
            (Phase::Closed { failures: 0 }, Phase::Closed { .. }) => {
                let mut warned = self.warned_at.lock().unwrap_or_else(|p| p.into_inner());
                if warned.is_none_or(|at| now.duration_since(at) >= FIRST_FAILURE_WARNING) {
                    *warned = Some(now);
                    tracing::warn!(
                        relay = %self.relay,
                        "publish failed for now ({why}); the relay tries again after a backoff, and its circuit opens after {OPEN_AFTER} failures in a row"
                    );
                }
            }
            (Phase::Closed { .. }, Phase::Open { cool_down, .. }) => tracing::warn!(
                relay = %self.relay,
                "relay circuit open: the broker keeps failing (the last time: {why}); publishing pauses, one probe every {cool_down:?} at first"
            ),
            (Phase::HalfOpen { .. }, Phase::Open { cool_down, .. }) => tracing::debug!(
                relay = %self.relay,
                "relay circuit probe failed; the next in {cool_down:?}"
            ),
            _ => {}
        }
        *phase = next;
        streak
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_after_a_streak_lets_one_probe_through_and_closes_on_success() {
        let c = Circuit::new("test".into(), Duration::from_secs(10));
        for _ in 0..OPEN_AFTER - 1 {
            c.failure("down");
            assert_eq!(c.admit(Duration::ZERO).await, Admit::Go);
        }
        c.failure("down");
        assert!(c.is_open());
        assert!(matches!(c.admit(Duration::ZERO).await, Admit::Later(_)));
        // After the cool-down: one probe, and the others wait for it.
        assert_eq!(c.admit(Duration::from_secs(1)).await, Admit::Go);
        assert!(matches!(
            c.admit(Duration::from_millis(100)).await,
            Admit::Later(_)
        ));
        // The probe fails: open again, twice as long.
        c.failure("down");
        let start = Instant::now();
        assert_eq!(c.admit(Duration::from_secs(5)).await, Admit::Go);
        assert_eq!(start.elapsed(), COOL_DOWN_MIN * 2);
        c.success();
        assert!(!c.is_open());
        assert_eq!(c.admit(Duration::ZERO).await, Admit::Go);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_failure_after_a_success_is_warned_of_once_a_minute_at_most() {
        let c = Circuit::new("test".into(), Duration::from_secs(10));
        let warned = || *c.warned_at.lock().unwrap();
        let start = Instant::now();
        c.failure("down");
        assert_eq!(warned(), Some(start));
        // Later failures of the streak are the circuit's to report.
        tokio::time::advance(Duration::from_secs(1)).await;
        c.failure("down");
        assert_eq!(warned(), Some(start));
        // A broker failing now and then: not again within the minute.
        c.success();
        tokio::time::advance(Duration::from_secs(30)).await;
        c.failure("down");
        assert_eq!(warned(), Some(start));
        c.success();
        tokio::time::advance(Duration::from_secs(30)).await;
        c.failure("down");
        assert_eq!(warned(), Some(start + Duration::from_secs(61)));
    }

    #[tokio::test(start_paused = true)]
    async fn failing_says_since_when_and_why_until_a_success() {
        let c = Circuit::new("test".into(), Duration::from_secs(10));
        assert_eq!(c.failing(), None);
        c.failure("timeout: no ack");
        tokio::time::advance(Duration::from_secs(3)).await;
        c.failure("connection: refused");
        assert_eq!(
            c.failing(),
            Some((Duration::from_secs(3), "connection: refused".to_owned()))
        );
        c.success();
        assert_eq!(c.failing(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_never_reports_is_replaced() {
        let c = Circuit::new("test".into(), Duration::from_secs(2));
        for _ in 0..OPEN_AFTER {
            c.failure("down");
        }
        assert_eq!(c.admit(Duration::from_secs(1)).await, Admit::Go);
        let start = Instant::now();
        assert_eq!(c.admit(Duration::from_secs(5)).await, Admit::Go);
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_go_as_soon_as_the_probe_succeeds() {
        let c = std::sync::Arc::new(Circuit::new("test".into(), Duration::from_secs(60)));
        for _ in 0..OPEN_AFTER {
            c.failure("down");
        }
        assert_eq!(c.admit(Duration::from_secs(1)).await, Admit::Go);
        let waiter = {
            let c = std::sync::Arc::clone(&c);
            tokio::spawn(async move { c.admit(Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        c.success();
        assert_eq!(waiter.await.unwrap(), Admit::Go);
    }
}
