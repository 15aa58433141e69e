//! Where a retry delay comes from: the per-task-type retry table.
//!
//! The table is a list of delays; the n-th failure waits the n-th delay. The
//! maximum number of attempts is the table's length, unless a submit gives
//! the task its own (`TaskOptions::max_attempts`): past the table's end the
//! last delay repeats.

use std::time::Duration;

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;

/// The default retry table: 1m, 5m, 15m, 30m, 1h, 2h, 4h, 8h, 12h, 1d.
/// Ten attempts over about 28 hours, 25 to 31 with the default jitter (the
/// tenth failure is final: its delay is waited only past the table's end,
/// see [`delay_after_failure`]).
pub const DEFAULT_RETRY_DELAYS: &[Duration] = &[
    Duration::from_secs(MINUTE),
    Duration::from_secs(5 * MINUTE),
    Duration::from_secs(15 * MINUTE),
    Duration::from_secs(30 * MINUTE),
    Duration::from_secs(HOUR),
    Duration::from_secs(2 * HOUR),
    Duration::from_secs(4 * HOUR),
    Duration::from_secs(8 * HOUR),
    Duration::from_secs(12 * HOUR),
    Duration::from_secs(24 * HOUR),
];

/// The delay before the next attempt after the failure that brings the
/// task's failure count to `retry_count + 1`.
///
/// Past the table's end (a task submitted with more attempts than its
/// table has, or whose budget an operator raised) the last delay repeats;
/// an empty table means "retry at once".
pub fn delay_after_failure(table: &[Duration], retry_count: i32) -> Duration {
    let index = usize::try_from(retry_count).unwrap_or(0);
    table
        .get(index)
        .or_else(|| table.last())
        .copied()
        .unwrap_or(Duration::ZERO)
}

/// The default spread of a retry's delay around the table's value, in
/// percent either way: tasks that failed together (a service down for a
/// minute fails every task sent to it) come back spread over a fifth of
/// their delay instead of all in the same second.
pub const DEFAULT_RETRY_JITTER_PERCENT: u32 = 10;

/// `delay` moved by up to `percent` of itself either way (capped at 100),
/// drawn uniformly.
pub fn jittered(delay: Duration, percent: u32) -> Duration {
    spread(delay, percent, crate::random::u64())
}

/// `delay` moved by `percent` of itself times a point of [-1, 1) that
/// `random` picks.
fn spread(delay: Duration, percent: u32, random: u64) -> Duration {
    let fraction = f64::from(percent.min(100)) / 100.0;
    // 53 random bits: a uniform point of [0, 1).
    let unit = (random >> 11) as f64 / (1u64 << 53) as f64;
    delay.mul_f64(1.0 + fraction * (2.0 * unit - 1.0))
}

/// The retry table of `N` attempts made from `source` (not empty): cut
/// there, or its last delay repeated up to it. What `#[outbox_task(...,
/// max_attempts = N)]` declares.
#[doc(hidden)]
pub const fn retry_table<const N: usize>(source: &[Duration]) -> [Duration; N] {
    let mut table = [Duration::ZERO; N];
    let mut i = 0;
    while i < N {
        let from = if i < source.len() {
            i
        } else {
            source.len() - 1
        };
        table[i] = source[from];
        i += 1;
    }
    table
}

/// The maximum number of attempts a retry table allows (its length, at
/// least one).
pub fn max_attempts(table: &[Duration]) -> i32 {
    i32::try_from(table.len()).unwrap_or(i32::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_percent_either_way_and_spreads() {
        let minute = Duration::from_secs(60);
        assert_eq!(spread(minute, 10, 0), Duration::from_secs(54));
        assert_eq!(spread(minute, 10, 1 << 63), minute);
        assert!(spread(minute, 10, u64::MAX) <= Duration::from_secs(66));
        assert_eq!(spread(minute, 0, u64::MAX), minute);
        assert_eq!(spread(minute, 250, 0), Duration::ZERO, "capped at 100%");
        assert_eq!(spread(Duration::ZERO, 10, 12345), Duration::ZERO);
        let drawn: std::collections::HashSet<Duration> =
            (0..100).map(|_| jittered(minute, 10)).collect();
        assert!(drawn.len() > 50, "{} distinct of 100", drawn.len());
        for d in drawn {
            assert!(
                d >= Duration::from_secs(54) && d <= Duration::from_secs(66),
                "{d:?}"
            );
        }
    }

    #[test]
    fn default_table_matches_the_documented_schedule() {
        let minutes: Vec<u64> = DEFAULT_RETRY_DELAYS
            .iter()
            .map(|d| d.as_secs() / 60)
            .collect();
        assert_eq!(minutes, [1, 5, 15, 30, 60, 120, 240, 480, 720, 1440]);
        assert_eq!(max_attempts(DEFAULT_RETRY_DELAYS), 10);
    }

    #[test]
    fn delay_is_indexed_by_failures_so_far_and_clamps() {
        let table = [Duration::from_secs(1), Duration::from_secs(2)];
        assert_eq!(delay_after_failure(&table, 0), Duration::from_secs(1));
        assert_eq!(delay_after_failure(&table, 1), Duration::from_secs(2));
        assert_eq!(delay_after_failure(&table, 7), Duration::from_secs(2));
        assert_eq!(delay_after_failure(&[], 3), Duration::ZERO);
        assert_eq!(max_attempts(&[]), 1);
    }
}
