//! Per-submission options: when, how urgent, which queue.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};

/// The lowest priority value (runs first).
pub const PRIORITY_MIN: i16 = 0;
/// The highest priority value (runs last).
pub const PRIORITY_MAX: i16 = 9;

/// Options for one submission; anything left unset comes from the task
/// type's declaration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskOptions {
    pub(crate) run_at: Option<DateTime<Utc>>,
    pub(crate) delay: Option<Duration>,
    pub(crate) priority: Option<i16>,
    pub(crate) queue: Option<String>,
}

impl TaskOptions {
    /// No overrides.
    pub fn new() -> Self {
        Self::default()
    }

    /// Run no earlier than this instant. Replaces any delay.
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = Some(at);
        self.delay = None;
        self
    }

    /// Run no earlier than this long after the submitting transaction's
    /// start (measured by the database clock). Replaces any run-at.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.run_at = None;
        self
    }

    /// Priority from 0 (first) to 9 (last).
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Put the task on this queue instead of the type's default.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Checks every value, so that a bad option fails before anything is
    /// written.
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(p) = self.priority {
            validate_priority(p)?;
        }
        if let Some(q) = &self.queue {
            validate_queue(q)?;
        }
        if let Some(d) = self.delay {
            delay_micros(d)?;
        }
        Ok(())
    }
}

/// Checks a priority is within 0..=9.
pub(crate) fn validate_priority(priority: i16) -> Result<()> {
    if (PRIORITY_MIN..=PRIORITY_MAX).contains(&priority) {
        Ok(())
    } else {
        Err(Error::InvalidOption(format!(
            "priority {priority} is out of range: use {PRIORITY_MIN} (first) to {PRIORITY_MAX} (last)"
        )))
    }
}

/// Checks a queue name is usable: non-empty, at most 128 characters,
/// letters, digits and `_-.:` only.
pub(crate) fn validate_queue(queue: &str) -> Result<()> {
    let ok_chars = queue
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if queue.is_empty() || queue.len() > 128 || !ok_chars {
        return Err(Error::InvalidOption(format!(
            "queue name {queue:?} is invalid: use 1 to 128 ASCII letters, digits or _-.:"
        )));
    }
    Ok(())
}

/// The longest delay (and retention) the engine accepts: 100 years. Far
/// beyond any real schedule, and far from PostgreSQL's timestamp limits, so
/// `now() + delay` can never overflow inside a statement.
pub const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A delay in whole microseconds, as the database stores intervals; longer
/// than [`MAX_DELAY`] is an error.
pub(crate) fn delay_micros(delay: Duration) -> Result<i64> {
    if delay > MAX_DELAY {
        return Err(Error::InvalidOption(format!(
            "delay {delay:?} is too long: the most is 100 years"
        )));
    }
    Ok(clamped_delay_micros(delay))
}

/// A delay in whole microseconds, clamped to [`MAX_DELAY`]: for delays that
/// come from handlers and retry tables, which must not fail a write.
pub(crate) fn clamped_delay_micros(delay: Duration) -> i64 {
    i64::try_from(delay.min(MAX_DELAY).as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_refused_with_the_range() {
        let err = TaskOptions::new().priority(10).validate().unwrap_err();
        assert!(err.to_string().contains("0 (first) to 9 (last)"), "{err}");
        assert!(TaskOptions::new().priority(-1).validate().is_err());
        assert!(TaskOptions::new().queue("").validate().is_err());
        assert!(TaskOptions::new().queue("has space").validate().is_err());
        assert!(TaskOptions::new().delay(Duration::MAX).validate().is_err());
        assert!(
            TaskOptions::new()
                .priority(9)
                .queue("reports.v2")
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn run_at_and_delay_replace_each_other() {
        let o = TaskOptions::new()
            .delay(Duration::from_secs(1))
            .run_at(Utc::now());
        assert!(o.delay.is_none() && o.run_at.is_some());
        let o = o.delay(Duration::from_secs(1));
        assert!(o.run_at.is_none() && o.delay.is_some());
    }
}
