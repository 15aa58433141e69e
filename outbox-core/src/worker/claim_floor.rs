//! Where a producer's next claim starts looking: above the last task its
//! previous claim took (the floor), so that a claim does not step over the
//! index entries of every task claimed before it.
//!
//! Those entries stay while any snapshot older than them is open (a long
//! report query, `pg_dump`, a forgotten `BEGIN` in psql): vacuum cannot
//! remove them, and a claim that always read the claimable index from its
//! front would visit all of them, every time. A drain beside such a
//! snapshot would then slow with its square (PERFORMANCE.md, "A drain
//! beside a held snapshot").
//!
//! The floor never hides a task: a claim always covers the whole claimable
//! index (claim_tasks.sql reads a higher priority first, then above the
//! floor, then below it), it only reads below the floor last. What the
//! floor changes is which claimable tasks of the floor's priority a full
//! claim takes first: those that became claimable behind it (a submit that
//! committed late, a recovered task, a key's next task) wait while the
//! tasks above fill every claim. So the floor lasts a second
//! ([`FLOOR_MAX_AGE`]); then one claim reads from the front, in the plain
//! claim order, and sets a new one.

use std::time::{Duration, Instant};

use crate::db::ClaimPosition;

/// How long a floor is used before a claim reads from the front again: the
/// most a task claimable behind the floor waits while the tasks above it
/// keep the worker busy.
pub(crate) const FLOOR_MAX_AGE: Duration = Duration::from_secs(1);

/// A producer's floor.
#[derive(Debug, Default)]
pub(crate) struct ClaimFloor {
    /// The floor, and when a claim last covered everything below it.
    at: Option<(ClaimPosition, Instant)>,
}

impl ClaimFloor {
    /// Where the next claim looks first.
    pub(crate) fn position(&self, now: Instant) -> ClaimPosition {
        match self.at {
            Some((at, since)) if now.saturating_duration_since(since) < FLOOR_MAX_AGE => at,
            _ => ClaimPosition::START,
        }
    }

    /// Records a claim made from `from` that wanted `wanted` tasks, got
    /// `got`, the last of them at `last` in the claim order.
    pub(crate) fn claimed(
        &mut self,
        from: ClaimPosition,
        wanted: usize,
        got: usize,
        last: Option<ClaimPosition>,
        now: Instant,
    ) {
        let Some(last) = last else {
            // Nothing claimable: the next claim reads from the front.
            self.at = None;
            return;
        };
        // A claim from the front, or one that came up short (it read below
        // the floor too and found nothing more), has covered everything
        // behind its last task: nothing has waited there since `now`.
        let covered = from == ClaimPosition::START || got < wanted;
        let since = match self.at {
            Some((_, since)) if !covered => since,
            _ => now,
        };
        self.at = Some((last, since));
    }

    /// Forgets the floor (the queue is claimed another way for now).
    pub(crate) fn forget(&mut self) {
        self.at = None;
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::*;

    fn at(id: i64) -> ClaimPosition {
        ClaimPosition {
            priority: 0,
            execute_at: DateTime::<Utc>::UNIX_EPOCH,
            id,
        }
    }

    #[test]
    fn a_new_floor_starts_at_the_front() {
        let floor = ClaimFloor::default();
        assert_eq!(floor.position(Instant::now()), ClaimPosition::START);
    }

    #[test]
    fn full_claims_move_the_floor_and_it_expires_a_second_after_the_front_was_read() {
        let t0 = Instant::now();
        let mut floor = ClaimFloor::default();
        floor.claimed(ClaimPosition::START, 10, 10, Some(at(10)), t0);
        assert_eq!(floor.position(t0), at(10));
        let t1 = t0 + Duration::from_millis(600);
        floor.claimed(at(10), 10, 10, Some(at(20)), t1);
        assert_eq!(floor.position(t1), at(20));
        // Full claims above the floor do not renew it: one second after the
        // front was last read, the next claim reads it again.
        assert_eq!(floor.position(t0 + FLOOR_MAX_AGE), ClaimPosition::START);
    }

    #[test]
    fn a_short_claim_renews_the_floor_and_an_empty_one_forgets_it() {
        let t0 = Instant::now();
        let mut floor = ClaimFloor::default();
        floor.claimed(ClaimPosition::START, 10, 10, Some(at(10)), t0);
        let t1 = t0 + Duration::from_millis(900);
        floor.claimed(at(10), 10, 3, Some(at(13)), t1);
        assert_eq!(floor.position(t0 + FLOOR_MAX_AGE), at(13));
        floor.claimed(at(13), 10, 0, None, t1);
        assert_eq!(floor.position(t1), ClaimPosition::START);
    }
}
