//! When a periodic task is due: a cron expression (5 fields, or 6 with
//! seconds first, or a nickname such as `@hourly`), optionally in a named
//! time zone (`CRON_TZ=Europe/Paris 0 3 * * *`), or a fixed interval
//! (`every 30s`), aligned to the Unix epoch so every worker computes the
//! same ticks.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};

/// A parsed schedule.
#[derive(Clone)]
pub struct Schedule {
    text: String,
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Cron(Box<Cron>, Tz),
    Every(Duration),
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schedule({:?})", self.text)
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The shortest interval accepted.
const MIN_EVERY: Duration = Duration::from_secs(1);

/// The longest interval accepted: ten years (longer ones would be
/// declarations that never run, and far enough out the arithmetic on
/// their ticks overflows).
const MAX_EVERY: Duration = Duration::from_secs(3660 * 86_400);

impl FromStr for Schedule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let text = s.trim().to_owned();
        if let Some(every) = text.strip_prefix("every ") {
            let d = parse_duration(every.trim())?;
            if d < MIN_EVERY {
                return Err(format!("{text:?}: the shortest interval is 1s"));
            }
            if d > MAX_EVERY {
                return Err(format!("{text:?}: the longest interval is 3660d"));
            }
            return Ok(Self {
                text,
                kind: Kind::Every(d),
            });
        }
        let (tz, expr) = match text.strip_prefix("CRON_TZ=") {
            Some(rest) => {
                let (zone, expr) = rest.split_once(' ').ok_or_else(|| {
                    format!("{text:?}: a cron expression must follow CRON_TZ=ZONE")
                })?;
                let tz: Tz = zone
                    .parse()
                    .map_err(|_| format!("{text:?}: unknown time zone {zone:?} (use an IANA name such as Europe/Paris)"))?;
                (tz, expr.trim())
            }
            None => (Tz::UTC, text.as_str()),
        };
        // The usual cron nicknames, at the start of their period.
        let expr = match expr {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            nickname if nickname.starts_with('@') => {
                return Err(format!(
                    "{text:?}: unknown cron nickname {nickname:?} (use @yearly, @annually, \
                     @monthly, @weekly, @daily, @midnight or @hourly)"
                ));
            }
            expr => expr,
        };
        let fields = expr.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(format!(
                "{text:?} is neither `every <duration>` nor a cron expression of 5 fields (minute hour day month weekday) or 6 (seconds first)"
            ));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(expr)
            .map_err(|e| format!("{text:?} is not a valid cron expression: {e}"))?;
        // A date that never comes (February 30th) would be accepted and
        // then silently never run.
        if cron
            .find_next_occurrence(&Utc::now().with_timezone(&tz), false)
            .is_err()
        {
            return Err(format!(
                "{text:?} never matches: no date has that day in that month"
            ));
        }
        Ok(Self {
            text,
            kind: Kind::Cron(Box::new(cron), tz),
        })
    }
}

impl Schedule {
    /// The schedule as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The latest tick at or before `now`, if there is one.
    pub fn latest_at_or_before(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.kind {
            Kind::Every(d) => {
                let step = i64::try_from(d.as_millis()).ok()?;
                let ms = now.timestamp_millis();
                DateTime::from_timestamp_millis(ms - ms.rem_euclid(step))
            }
            Kind::Cron(cron, tz) => cron
                .find_previous_occurrence(&now.with_timezone(tz), true)
                .ok()
                .map(|t| t.with_timezone(&Utc)),
        }
    }

    /// The first tick after `now`.
    pub fn next_after(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.kind {
            Kind::Every(d) => {
                let step = TimeDelta::from_std(*d).ok()?;
                self.latest_at_or_before(now)?.checked_add_signed(step)
            }
            Kind::Cron(cron, tz) => cron
                .find_next_occurrence(&now.with_timezone(tz), false)
                .ok()
                .map(|t| t.with_timezone(&Utc)),
        }
    }
}

/// `30s`, `5m`, `1h30m`, `250ms`, `2d`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration like 30s, 5m, 1h30m or 2d");
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86_400),
            _ => return Err(bad()),
        };
        total = total
            .checked_add(
                unit.checked_mul(u32::try_from(n).map_err(|_| bad())?)
                    .ok_or_else(bad)?,
            )
            .ok_or_else(bad)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_that_would_never_run_or_overflow_are_refused() {
        let err = "every 96000000d".parse::<Schedule>().unwrap_err();
        assert!(err.contains("the longest interval is 3660d"), "{err}");
        let err = "0 0 30 2 *".parse::<Schedule>().unwrap_err();
        assert!(err.contains("never matches"), "{err}");
        let err = "CRON_TZ=Europe/Paris 0 0 31 4 *"
            .parse::<Schedule>()
            .unwrap_err();
        assert!(err.contains("never matches"), "{err}");
        // The longest accepted still has ticks, whenever it is asked.
        let hourly: Schedule = "@hourly".parse().unwrap();
        assert_eq!(hourly.as_str(), "@hourly");
        let daily_in_paris: Schedule = "CRON_TZ=Europe/Paris @daily".parse().unwrap();
        assert!(daily_in_paris.as_str().ends_with("@daily"));
        assert!(
            "@fortnightly"
                .parse::<Schedule>()
                .unwrap_err()
                .contains("unknown cron nickname")
        );
        let longest: Schedule = "every 3660d".parse().unwrap();
        for now in [at("2026-11-28T00:00:00Z"), DateTime::<Utc>::MAX_UTC] {
            let _ = longest.next_after(now);
            let _ = longest.latest_at_or_before(now);
        }
        assert!(longest.next_after(at("2026-11-28T00:00:00Z")).is_some());
        // Leap days come.
        assert!("0 0 29 2 *".parse::<Schedule>().is_ok());
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn intervals_tick_on_multiples_of_the_interval() {
        let s: Schedule = "every 30s".parse().unwrap();
        assert_eq!(
            s.latest_at_or_before(at("2026-11-22T10:00:47Z")),
            Some(at("2026-11-22T10:00:30Z"))
        );
        assert_eq!(
            s.next_after(at("2026-11-22T10:00:47Z")),
            Some(at("2026-11-22T10:01:00Z"))
        );
    }

    #[test]
    fn cron_with_and_without_seconds_and_in_a_time_zone() {
        let daily: Schedule = "0 3 * * *".parse().unwrap();
        assert_eq!(
            daily.latest_at_or_before(at("2026-11-22T10:00:00Z")),
            Some(at("2026-11-22T03:00:00Z"))
        );
        assert_eq!(
            daily.next_after(at("2026-11-22T10:00:00Z")),
            Some(at("2026-11-23T03:00:00Z"))
        );
        let secs: Schedule = "*/10 * * * * *".parse().unwrap();
        assert_eq!(
            secs.next_after(at("2026-11-22T10:00:01Z")),
            Some(at("2026-11-22T10:00:10Z"))
        );
        // 03:00 in Paris is 02:00 UTC in winter.
        let paris: Schedule = "CRON_TZ=Europe/Paris 0 3 * * *".parse().unwrap();
        assert_eq!(
            paris.next_after(at("2026-11-22T10:00:00Z")),
            Some(at("2026-11-23T02:00:00Z"))
        );
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        for (bad, says) in [
            ("every", "neither"),
            ("every 0s", "shortest"),
            ("every soon", "not a duration"),
            ("* * *", "neither"),
            ("61 * * * *", "not a valid cron"),
            ("CRON_TZ=Mars/Olympus 0 3 * * *", "unknown time zone"),
        ] {
            let e = bad.parse::<Schedule>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
