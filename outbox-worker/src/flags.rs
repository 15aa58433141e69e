//! Value parsers for numeric and duration flags, each with its range, so a
//! bad value is a clear exit-code-2 message at parse time and never a panic
//! or a silent clamp later.

use std::time::Duration;

/// A millisecond.
pub(crate) const MS: Duration = Duration::from_millis(1);
/// A second.
pub(crate) const SECOND: Duration = Duration::from_secs(1);
/// A minute.
pub(crate) const MINUTE: Duration = Duration::from_secs(60);
/// An hour.
pub(crate) const HOUR: Duration = Duration::from_secs(3600);
/// A day.
pub(crate) const DAY: Duration = Duration::from_secs(24 * 3600);

/// Parses a duration (`250ms`, `30s`, `5m`, `7d`) within `min..=max`.
/// Its flags take values that begin with a hyphen (`allow_hyphen_values`),
/// so that `--delay -1s` reaches this parser and is named negative, where
/// clap would call `-1` an unknown argument and suggest `-- -1`.
pub(crate) fn duration(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        if s.trim_start().starts_with('-') {
            return Err(format!(
                "{s} is negative: use {} to {}",
                short(min),
                short(max)
            ));
        }
        if let Some(unit) = calendar_unit(s) {
            return Err(format!(
                "{s} uses {unit:?}, a month or a year of 30.44 or 365.25 days (\"M\" is a \
                 month, not a minute): write days (30d) or minutes (1m)"
            ));
        }
        let d = humantime::parse_duration(s).map_err(|e| {
            format!("{s:?} is not a duration ({e}); write it like 250ms, 30s, 5m or 7d")
        })?;
        if d < min || d > max {
            return Err(format!(
                "{s} is out of range: use {} to {}",
                short(min),
                short(max)
            ));
        }
        Ok(d)
    }
}

/// The first unit of `s` that is a month or a year: humantime reads `1M`
/// as a month, which an operator who meant a minute would not notice until
/// the task ran a month late.
fn calendar_unit(s: &str) -> Option<&str> {
    s.split(|c: char| !c.is_ascii_alphabetic())
        .find(|unit| matches!(*unit, "M" | "month" | "months" | "y" | "year" | "years"))
}

/// A duration as an operator writes it: `3650d`, `1h`, `100ms`.
pub(crate) fn short(d: Duration) -> String {
    let (secs, ms) = (d.as_secs(), d.subsec_millis());
    match (secs, ms) {
        (0, 0) => "0s".to_owned(),
        (0, ms) => format!("{ms}ms"),
        (s, 0) if s % 86_400 == 0 => format!("{}d", s / 86_400),
        (s, 0) if s % 3600 == 0 => format!("{}h", s / 3600),
        (s, 0) if s % 60 == 0 => format!("{}m", s / 60),
        (s, 0) => format!("{s}s"),
        _ => humantime::format_duration(d).to_string(),
    }
}

/// A whole number in `min..=max`, as `T`. Out of range, negative where
/// the flag cannot be, or not a number at all, the message names the range
/// ("-1 is not in 0..=9"; clap's own unsigned parsers said "invalid digit
/// found in string" for a minus sign).
fn whole<T>(
    min: i128,
    max: i128,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<i128>,
{
    move |s: &str| match s.trim().parse::<i128>() {
        Ok(n) if (min..=max).contains(&n) => {
            T::try_from(n).map_err(|_| format!("{n} is not in {min}..={max}"))
        }
        Ok(n) => Err(format!("{n} is not in {min}..={max}")),
        Err(_) => Err(format!("{s:?} is not a whole number in {min}..={max}")),
    }
}

/// A whole number in `min..=max`, as usize.
pub(crate) fn count(
    min: u64,
    max: u64,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    whole(min.into(), max.into())
}

/// A whole number in `min..=max`, as u32.
pub(crate) fn count_u32(
    min: u64,
    max: u64,
) -> impl Fn(&str) -> Result<u32, String> + Clone + Send + Sync + 'static {
    whole(min.into(), max.into())
}

/// A whole number in `min..=max`, as u64.
pub(crate) fn count_u64(
    min: u64,
    max: u64,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    whole(min.into(), max.into())
}

/// A whole number in `min..=max`, as i64.
pub(crate) fn int_i64(
    min: i64,
    max: i64,
) -> impl Fn(&str) -> Result<i64, String> + Clone + Send + Sync + 'static {
    whole(min.into(), max.into())
}

/// A whole number in `min..=max`, as i16.
pub(crate) fn int_i16(
    min: i64,
    max: i64,
) -> impl Fn(&str) -> Result<i16, String> + Clone + Send + Sync + 'static {
    whole(min.into(), max.into())
}

/// A whole number in `min..=max`, as i32, with a message naming the range.
pub(crate) fn int_i32(
    min: i32,
    max: i32,
) -> impl Fn(&str) -> Result<i32, String> + Clone + Send + Sync + 'static {
    move |s: &str| match s.trim().parse::<i64>() {
        Ok(n) if (i64::from(min)..=i64::from(max)).contains(&n) => {
            Ok(i32::try_from(n).unwrap_or(max))
        }
        Ok(n) => Err(format!("{n} is out of range: use {min} to {max}")),
        Err(_) => Err(format!("{s:?} is not a whole number: use {min} to {max}")),
    }
}

/// The most attempts per second a queue's rate may allow.
const MAX_RATE: f64 = 1_000_000.0;

/// A rate: `N/s`, `N/m` or `N/h` (N a positive number, at most a million
/// per second), as attempts per second, or `none` (no limit).
pub(crate) fn rate(s: &str) -> Result<Option<f64>, String> {
    if s == "none" {
        return Ok(None);
    }
    let usage = "write it as N/s, N/m or N/h (like 50/s or 100/m), or none";
    let (n, unit) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not a rate: {usage}"))?;
    let per = match unit.trim() {
        "s" | "sec" | "second" => 1.0,
        "m" | "min" | "minute" => 60.0,
        "h" | "hour" => 3600.0,
        other => return Err(format!("{other:?} is not a rate unit: {usage}")),
    };
    let n: f64 = n
        .trim()
        .parse()
        .map_err(|_| format!("{n:?} is not a number: {usage}"))?;
    let per_second = n / per;
    if !(n.is_finite() && n > 0.0 && per_second <= MAX_RATE) {
        return Err(format!(
            "{s} is out of range: use more than 0 and at most {MAX_RATE}/s"
        ));
    }
    Ok(Some(per_second))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_limits_are_checked_with_their_range() {
        assert_eq!(rate("50/s"), Ok(Some(50.0)));
        assert_eq!(rate("120/m"), Ok(Some(2.0)));
        assert_eq!(rate("none"), Ok(None));
        for bad in [
            "0/s",
            "-1/s",
            "NaN/s",
            "inf/s",
            "5",
            "5/d",
            "x/s",
            "2000000/s",
            "1e400/s",
        ] {
            assert!(rate(bad).is_err(), "{bad}");
        }
        let limit = int_i32(1, 10);
        assert_eq!(limit("3"), Ok(3));
        assert!(limit("0").unwrap_err().contains("use 1 to 10"));
        assert!(
            limit("99999999999999999999")
                .unwrap_err()
                .contains("not a whole number")
        );
        assert!(limit("-5").unwrap_err().contains("out of range"));
    }

    #[test]
    fn durations_outside_their_range_are_refused_with_the_range() {
        let parse = duration(100 * MS, HOUR);
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        let err = parse("0s").unwrap_err();
        assert!(
            err.contains("out of range") && err.contains("100ms"),
            "{err}"
        );
        assert!(parse("2h").unwrap_err().contains("use 100ms to 1h"));
        let long = duration(Duration::ZERO, 3650 * DAY);
        assert!(long("9999d").unwrap_err().contains("use 0s to 3650d"));
        assert!(parse("soon").unwrap_err().contains("not a duration"));
        assert!(parse("99999999999999999999years").is_err());
    }

    #[test]
    fn months_and_years_are_refused_for_days_or_minutes() {
        let long = duration(Duration::ZERO, 36_500 * DAY);
        for calendar in ["1M", "2months", "1y", "1year 2d", "3d 1M"] {
            let err = long(calendar).unwrap_err();
            assert!(err.contains("write days (30d) or minutes (1m)"), "{err}");
        }
        assert_eq!(long("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(long("2min 30s"), Ok(Duration::from_secs(150)));
        assert_eq!(long("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(long("30d"), Ok(30 * DAY));
    }
}
