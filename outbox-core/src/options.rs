//! Per-submission options: when, how urgent, which queue, and what makes
//! the task unique.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};

/// The lowest priority value (runs first).
pub const PRIORITY_MIN: i16 = 0;
/// The highest priority value (runs last).
pub const PRIORITY_MAX: i16 = 9;
/// The most attempts a submit may give a task ([`TaskOptions::max_attempts`]).
pub const MAX_ATTEMPTS_LIMIT: u32 = 10_000;

/// Options for one submission; anything left unset comes from the task
/// type's declaration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskOptions {
    pub(crate) run_at: Option<DateTime<Utc>>,
    pub(crate) delay: Option<Duration>,
    pub(crate) priority: Option<i16>,
    pub(crate) queue: Option<String>,
    pub(crate) unique: Option<Unique>,
    pub(crate) ordering_key: Option<String>,
    pub(crate) max_attempts: Option<u32>,
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

    /// Makes the task unique (replacing what its type declares): while a
    /// task with the same key is in a state the uniqueness covers, this one
    /// is not inserted and the submit returns that task's id instead.
    pub fn unique(mut self, unique: Unique) -> Self {
        self.unique = Some(unique);
        self
    }

    /// Gives the task an ordering key (replacing what its type declares):
    /// tasks with the same key in a queue run one at a time (or up to the
    /// queue's per-key concurrency), in the order their submitting
    /// transactions committed; different keys run in parallel. A task that
    /// fails keeps its key waiting for its retry, and a dead one blocks it
    /// until an operator retries, cancels or skips it (unless its type
    /// declares `on_dead = "skip"`).
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// How many attempts the task gets, from 1 (no retry) to
    /// [`MAX_ATTEMPTS_LIMIT`], instead of its type's (the length of its
    /// retry table). The n-th failure still waits the table's n-th delay;
    /// past the table's end its last delay repeats.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Shorthand for `.unique(Unique::key(key))`.
    pub fn unique_key(self, key: impl Into<String>) -> Self {
        self.unique(Unique::key(key))
    }

    /// Checks every value, so that a bad option fails before anything is
    /// written.
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(u) = &self.unique {
            u.validate()?;
        }
        if let Some(p) = self.priority {
            validate_priority(p)?;
        }
        if let Some(k) = &self.ordering_key {
            validate_ordering_key(k)?;
        }
        if let Some(q) = &self.queue {
            validate_queue(q)?;
        }
        if let Some(d) = self.delay {
            delay_micros(d)?;
        }
        if let Some(n) = self.max_attempts {
            attempts_as_sql(n)?;
        }
        Ok(())
    }
}

/// An attempt budget as the column stores it, or why it cannot be one.
pub(crate) fn attempts_as_sql(attempts: u32) -> Result<i32> {
    match i32::try_from(attempts) {
        Ok(n) if (1..=MAX_ATTEMPTS_LIMIT).contains(&attempts) => Ok(n),
        _ => Err(Error::InvalidOption(format!(
            "max_attempts {attempts} is out of range: use 1 (no retry) to {MAX_ATTEMPTS_LIMIT}"
        ))),
    }
}

/// What makes a task unique, and for how long.
///
/// Two tasks of the same type with the same key cannot both be in a state
/// the uniqueness covers: by default pending, processing, and failed with
/// attempts left (a task moves between these and back, so they always go
/// together); [`Unique::including_completed`] and
/// [`Unique::including_dead`] extend it. [`Unique::per`] limits it to a
/// period ("at most one per hour"): the key is combined with the period the
/// database clock is in at insert. A unique index enforces all of it, so
/// concurrent submits can never both insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unique {
    pub(crate) key: String,
    pub(crate) period: Option<Duration>,
    pub(crate) states: i16,
}

/// The states every uniqueness covers: pending, processing, failed with
/// attempts left.
pub(crate) const UNIQUE_ALWAYS: i16 = 1 | 2 | 4;
const UNIQUE_COMPLETED: i16 = 8;
const UNIQUE_DEAD: i16 = 16;
/// The longest unique key accepted, in bytes.
pub const MAX_UNIQUE_KEY: usize = 1024;

impl Unique {
    /// Unique by `key` (within the task type).
    pub fn key(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            period: None,
            states: UNIQUE_ALWAYS,
        }
    }

    /// At most one task with this key per `period` (1 second or more),
    /// periods counted from the Unix epoch on the database clock, among the
    /// states the uniqueness covers: a task that completed within the
    /// period counts only with [`Unique::including_completed`].
    pub fn per(mut self, period: Duration) -> Self {
        self.period = Some(period);
        self
    }

    /// Also covers completed tasks (until cleanup deletes them).
    pub fn including_completed(mut self) -> Self {
        self.states |= UNIQUE_COMPLETED;
        self
    }

    /// Also covers dead tasks (until an operator retries them).
    pub fn including_dead(mut self) -> Self {
        self.states |= UNIQUE_DEAD;
        self
    }

    /// The key as given.
    pub fn key_str(&self) -> &str {
        &self.key
    }

    pub(crate) fn validate(&self) -> Result<()> {
        // As an ordering key: an empty one is a mistake (a field left
        // blank), and every task given it would be one task.
        if self.key.is_empty() {
            return Err(Error::InvalidOption(format!(
                "a unique key cannot be empty: use 1 to {MAX_UNIQUE_KEY} bytes"
            )));
        }
        if self.key.len() > MAX_UNIQUE_KEY {
            return Err(Error::InvalidOption(format!(
                "unique key of {} bytes is too long: the most is {MAX_UNIQUE_KEY}",
                self.key.len()
            )));
        }
        if self.key.contains('\0') {
            return Err(Error::InvalidOption(
                "a unique key cannot contain the character U+0000".to_owned(),
            ));
        }
        if let Some(p) = self.period
            && (p < Duration::from_secs(1) || p > MAX_DELAY)
        {
            return Err(Error::InvalidOption(format!(
                "unique period {p:?} is out of range: use 1 second to 100 years"
            )));
        }
        Ok(())
    }

    /// The period in whole microseconds.
    pub(crate) fn period_us(&self) -> Option<i64> {
        self.period.map(clamped_delay_micros)
    }
}

/// Builds a type's uniqueness from its payload fields (what
/// `#[outbox_task(unique_by = [...])]` generates): the key is the fields'
/// values as JSON.
#[doc(hidden)]
pub fn unique_from_fields<T: serde::Serialize + ?Sized>(
    fields: &T,
    period_ms: Option<u64>,
    states: i16,
) -> std::result::Result<Unique, String> {
    let key = serde_json::to_string(fields).map_err(|e| e.to_string())?;
    Ok(Unique {
        key,
        period: period_ms.map(Duration::from_millis),
        states: states | UNIQUE_ALWAYS,
    })
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

/// The longest ordering key accepted, in bytes.
pub(crate) const MAX_ORDERING_KEY: usize = 512;

/// Checks an ordering key: 1 to 512 bytes, without U+0000.
pub(crate) fn validate_ordering_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_ORDERING_KEY {
        return Err(Error::InvalidOption(format!(
            "ordering key of {} bytes is out of range: use 1 to {MAX_ORDERING_KEY} bytes",
            key.len()
        )));
    }
    if key.contains('\0') {
        return Err(Error::InvalidOption(
            "an ordering key cannot contain the character U+0000".to_owned(),
        ));
    }
    Ok(())
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
    fn unique_options_are_checked_and_always_cover_the_live_states() {
        let u = Unique::key("order-7").including_dead();
        assert_eq!(u.states, UNIQUE_ALWAYS | 16);
        assert!(TaskOptions::new().unique(u).validate().is_ok());
        let long = Unique::key("k".repeat(MAX_UNIQUE_KEY + 1));
        assert!(TaskOptions::new().unique(long).validate().is_err());
        let empty = Unique::key("");
        assert!(
            TaskOptions::new()
                .unique(empty)
                .validate()
                .unwrap_err()
                .to_string()
                .contains("cannot be empty")
        );
        let short = Unique::key("k").per(Duration::from_millis(10));
        assert!(
            short
                .validate()
                .unwrap_err()
                .to_string()
                .contains("1 second")
        );
        let from_fields = unique_from_fields(&(7, "a"), Some(3_600_000), 8).unwrap();
        assert_eq!(from_fields.key, r#"[7,"a"]"#);
        assert_eq!(from_fields.states, UNIQUE_ALWAYS | 8);
        assert_eq!(from_fields.period_us(), Some(3_600_000_000));
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
