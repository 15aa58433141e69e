//! How the commands print a moment for people (JSON output keeps RFC 3339):
//! UTC always, one shape. Detail views (`tasks show`, `workflows show`,
//! `events`) give milliseconds and say UTC, as explain's reasons do
//! (`outbox::admin::show_time`); list columns give seconds, and their
//! headers say UTC.

use chrono::{DateTime, Utc};

/// `2026-11-30 16:15:21.123 UTC`: a moment in a detail view.
pub(crate) fn at(t: DateTime<Utc>) -> String {
    outbox::admin::show_time(t)
}

/// `2026-11-30 16:15:21`: a moment in a list column headed `(UTC)`.
pub(crate) fn column(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_printed_in_utc_in_one_shape() {
        let t = DateTime::parse_from_rfc3339("2026-11-30T17:15:21.123456+01:00")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(at(t), "2026-11-30 16:15:21.123 UTC");
        assert_eq!(column(t), "2026-11-30 16:15:21");
    }
}
