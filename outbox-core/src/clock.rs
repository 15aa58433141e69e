//! The clock the engine's time-dependent statements use.
//!
//! In production every timestamp comes from the database's `now()`. Tests
//! pin or advance a fixed clock instead of sleeping: each statement takes the
//! clock as an optional parameter (`coalesce($n, now())`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// Where "now" comes from.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    fixed: Option<Arc<Mutex<DateTime<Utc>>>>,
}

impl Clock {
    /// The database's clock (the default).
    pub fn database() -> Self {
        Self::default()
    }

    /// A clock that stands still at `at` until set or advanced.
    pub fn fixed(at: DateTime<Utc>) -> Self {
        Self {
            fixed: Some(Arc::new(Mutex::new(at))),
        }
    }

    /// Moves a fixed clock to `at`; no effect on the database clock.
    pub fn set(&self, at: DateTime<Utc>) {
        if let Some(fixed) = &self.fixed {
            *fixed.lock().unwrap_or_else(|e| e.into_inner()) = at;
        }
    }

    /// Moves a fixed clock forward; no effect on the database clock.
    pub fn advance(&self, by: Duration) {
        if let Some(fixed) = &self.fixed {
            let mut at = fixed.lock().unwrap_or_else(|e| e.into_inner());
            *at += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
        }
    }

    /// The value to pass as the "now" parameter: `None` means the database's
    /// own `now()`.
    pub fn now(&self) -> Option<DateTime<Utc>> {
        self.fixed
            .as_ref()
            .map(|fixed| *fixed.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
