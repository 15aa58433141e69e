//! Value parsers for numeric and duration flags, each with its range, so a
//! bad value is a clear exit-code-2 message at parse time and never a panic
//! or a silent clamp later.

use std::time::Duration;

use clap::builder::{RangedI64ValueParser, RangedU64ValueParser};

/// A millisecond.
pub(crate) const MS: Duration = Duration::from_millis(1);
/// A second.
pub(crate) const SECOND: Duration = Duration::from_secs(1);
/// An hour.
pub(crate) const HOUR: Duration = Duration::from_secs(3600);
/// A day.
pub(crate) const DAY: Duration = Duration::from_secs(24 * 3600);

/// Parses a duration (`250ms`, `30s`, `5m`, `7d`) within `min..=max`.
pub(crate) fn duration(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let d = humantime::parse_duration(s).map_err(|e| {
            format!("{s:?} is not a duration ({e}); write it like 250ms, 30s, 5m or 7d")
        })?;
        if d < min || d > max {
            return Err(format!(
                "{} is out of range: use {} to {}",
                humantime::format_duration(d),
                humantime::format_duration(min),
                humantime::format_duration(max)
            ));
        }
        Ok(d)
    }
}

/// A whole number in `min..=max`, as usize.
pub(crate) fn count(min: u64, max: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::<usize>::new().range(min..=max)
}

/// A whole number in `min..=max`, as u32.
pub(crate) fn count_u32(min: u64, max: u64) -> RangedU64ValueParser<u32> {
    RangedU64ValueParser::<u32>::new().range(min..=max)
}

/// A whole number in `min..=max`, as u64.
pub(crate) fn count_u64(min: u64, max: u64) -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::<u64>::new().range(min..=max)
}

/// A whole number in `min..=max`, as i64.
pub(crate) fn int_i64(min: i64, max: i64) -> RangedI64ValueParser<i64> {
    RangedI64ValueParser::<i64>::new().range(min..=max)
}

/// A whole number in `min..=max`, as i16.
pub(crate) fn int_i16(min: i64, max: i64) -> RangedI64ValueParser<i16> {
    RangedI64ValueParser::<i16>::new().range(min..=max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_outside_their_range_are_refused_with_the_range() {
        let parse = duration(100 * MS, HOUR);
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        let err = parse("0s").unwrap_err();
        assert!(
            err.contains("out of range") && err.contains("100ms"),
            "{err}"
        );
        assert!(parse("2h").unwrap_err().contains("1h"));
        assert!(parse("soon").unwrap_err().contains("not a duration"));
        assert!(parse("99999999999999999999years").is_err());
    }
}
