//! Where a producer's next claim starts reading: above the last task its
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
//! index (migration 18's `outbox_claim_tasks` reads a higher priority
//! first, then above the floor, then below it), it only reads below the
//! floor last. What the floor changes is which claimable tasks of the
//! floor's priority a full claim takes first: those that became claimable
//! behind it (a submit that committed late, a recovered task, a key's next
//! task) wait while the tasks above fill every claim. So the floor lasts a
//! second ([`FLOOR_MAX_AGE`]); then one claim walks the whole index in the
//! plain claim order, and sets a new one.
//!
//! Beside a snapshot held for minutes, that walk steps over millions of
//! entries and takes a good part of a second, and so does every claim that
//! comes up short (it reads below the floor too), as each drain's last
//! claims do. So while walks are slow ([`SLOW_WALK`]):
//! - the floor lasts long enough that walks take at most a twentieth of the
//!   producer's time ([`WALK_SHARE`]), never longer than
//!   [`FLOOR_MAX_AGE_CAP`];
//! - below the floor, a claim reads only from the front: the first task the
//!   last walk found. A task that became claimable before the front (a
//!   key's next task submitted long ago) waits for the next walk, which a
//!   producer with nothing to do does not sleep past (`walk_due_in`).

use std::time::{Duration, Instant};

use crate::db::{ClaimPosition, ClaimStart};

/// How long a floor lasts before a claim walks the whole index again: the
/// most a task claimable behind the floor waits while the tasks above it
/// keep the worker busy, unless walks are slow.
pub(crate) const FLOOR_MAX_AGE: Duration = Duration::from_secs(1);

/// A walk of the whole index this slow means an open snapshot keeps many
/// entries in it: claims read below the floor only from the front, and the
/// floor lasts longer.
pub(crate) const SLOW_WALK: Duration = Duration::from_millis(100);

/// A floor lasts at least this many times as long as the last walk.
pub(crate) const WALK_SHARE: u32 = 20;

/// The longest a floor lasts, however slow the walks.
pub(crate) const FLOOR_MAX_AGE_CAP: Duration = Duration::from_secs(30);

/// What a claim asked for and what it found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim {
    pub(crate) wanted: usize,
    pub(crate) got: usize,
    /// The first and last tasks it took, in the claim order.
    pub(crate) first: Option<ClaimPosition>,
    pub(crate) last: Option<ClaimPosition>,
    /// How long the claim statement took.
    pub(crate) took: Duration,
}

/// A producer's floor.
#[derive(Debug, Default)]
pub(crate) struct ClaimFloor {
    /// The floor, and when a claim last walked the whole index.
    at: Option<(ClaimPosition, Instant)>,
    /// How long the last walk of the whole index took.
    walk: Duration,
    /// The first task the last walk found.
    front: Option<ClaimPosition>,
}

impl ClaimFloor {
    /// Where the next claim starts reading.
    pub(crate) fn start(&self, now: Instant) -> ClaimStart {
        match self.at {
            Some((floor, since)) if now.saturating_duration_since(since) < self.max_age() => {
                ClaimStart {
                    floor,
                    front: self
                        .front
                        .filter(|f| self.walk >= SLOW_WALK && f.priority == floor.priority),
                }
            }
            _ => ClaimStart::FRONT,
        }
    }

    /// How long the floor lasts now.
    fn max_age(&self) -> Duration {
        (self.walk * WALK_SHARE).clamp(FLOOR_MAX_AGE, FLOOR_MAX_AGE_CAP)
    }

    /// Records a claim that started at `start`.
    pub(crate) fn claimed(&mut self, start: ClaimStart, claim: Claim, now: Instant) {
        // A claim from the front, or one that came up short having read
        // all below the floor, walked the whole index: nothing has waited
        // in it since `now`, and its time is what a walk costs now.
        let walked =
            start == ClaimStart::FRONT || (claim.got < claim.wanted && start.front.is_none());
        if walked {
            self.walk = claim.took;
            self.front = claim.first;
        }
        let Some(last) = claim.last else {
            if start.front.is_none() {
                // Nothing claimable: the next claim walks the whole index.
                self.at = None;
            }
            // Read from the front, nothing found: tasks may still wait
            // before it, so the floor stays and its walk stays due
            // (`walk_due_in`).
            return;
        };
        let since = match self.at {
            Some((_, since)) if !walked => since,
            _ => now,
        };
        self.at = Some((last, since));
    }

    /// How soon a walk of the whole index is due while claims read below
    /// the floor only from the front: a producer with nothing to do must
    /// not sleep past it, or a task before the front would wait for the
    /// next poll instead.
    pub(crate) fn walk_due_in(&self, now: Instant) -> Option<Duration> {
        let (_, since) = self.at?;
        (self.walk >= SLOW_WALK).then(|| {
            self.max_age()
                .saturating_sub(now.saturating_duration_since(since))
        })
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

    fn claim(wanted: usize, ids: Option<(i64, i64)>, ms: u64) -> Claim {
        Claim {
            wanted,
            got: ids.map_or(0, |(first, last)| (last - first + 1) as usize),
            first: ids.map(|(first, _)| at(first)),
            last: ids.map(|(_, last)| at(last)),
            took: Duration::from_millis(ms),
        }
    }

    fn floor_at(id: i64) -> ClaimStart {
        ClaimStart {
            floor: at(id),
            front: None,
        }
    }

    #[test]
    fn a_new_floor_walks_the_whole_index() {
        let floor = ClaimFloor::default();
        assert_eq!(floor.start(Instant::now()), ClaimStart::FRONT);
    }

    #[test]
    fn full_claims_move_the_floor_and_a_second_after_the_last_walk_the_next_walks() {
        let t0 = Instant::now();
        let mut floor = ClaimFloor::default();
        floor.claimed(ClaimStart::FRONT, claim(10, Some((1, 10)), 1), t0);
        assert_eq!(floor.start(t0), floor_at(10));
        let t1 = t0 + Duration::from_millis(600);
        floor.claimed(floor_at(10), claim(10, Some((11, 20)), 1), t1);
        assert_eq!(floor.start(t1), floor_at(20));
        // Full claims above the floor do not renew it.
        assert_eq!(floor.start(t0 + FLOOR_MAX_AGE), ClaimStart::FRONT);
    }

    #[test]
    fn a_short_claim_renews_the_floor_and_an_empty_one_forgets_it() {
        let t0 = Instant::now();
        let mut floor = ClaimFloor::default();
        floor.claimed(ClaimStart::FRONT, claim(10, Some((1, 10)), 1), t0);
        let t1 = t0 + Duration::from_millis(900);
        floor.claimed(floor_at(10), claim(10, Some((11, 13)), 1), t1);
        assert_eq!(floor.start(t0 + FLOOR_MAX_AGE), floor_at(13));
        floor.claimed(floor_at(13), claim(10, None, 1), t1);
        assert_eq!(floor.start(t1), ClaimStart::FRONT);
    }

    #[test]
    fn slow_walks_make_the_floor_last_longer_and_read_below_it_from_the_front() {
        let t0 = Instant::now();
        let mut floor = ClaimFloor::default();
        // A 200 ms walk that found tasks 5 to 14: the floor lasts 4 s, and
        // below it claims read from task 5.
        floor.claimed(ClaimStart::FRONT, claim(10, Some((5, 14)), 200), t0);
        let slow = ClaimStart {
            floor: at(14),
            front: Some(at(5)),
        };
        assert_eq!(floor.start(t0 + Duration::from_millis(3900)), slow);
        assert_eq!(floor.start(t0 + Duration::from_secs(4)), ClaimStart::FRONT);
        // A claim that comes up short reading from the front is no walk: it
        // neither renews the floor nor moves the front.
        floor.claimed(slow, claim(10, Some((15, 16)), 5_000), t0);
        assert_eq!(
            floor.start(t0 + Duration::from_millis(3900)),
            ClaimStart {
                floor: at(16),
                front: Some(at(5)),
            }
        );
        assert_eq!(floor.start(t0 + Duration::from_secs(4)), ClaimStart::FRONT);
        // However slow the walk, the floor lasts 30 s at most.
        floor.claimed(ClaimStart::FRONT, claim(10, Some((1, 10)), 60_000), t0);
        assert_eq!(floor.start(t0 + FLOOR_MAX_AGE_CAP), ClaimStart::FRONT);
    }

    #[test]
    fn fast_walks_read_all_below_the_floor() {
        let t0 = Instant::now();
        let mut floor = ClaimFloor::default();
        floor.claimed(ClaimStart::FRONT, claim(10, Some((5, 14)), 99), t0);
        assert_eq!(floor.start(t0), floor_at(14));
    }

    #[test]
    fn an_empty_claim_from_the_front_keeps_the_floor_and_its_walk_due() {
        let t0 = Instant::now();
        let mut floor = ClaimFloor::default();
        assert_eq!(floor.walk_due_in(t0), None);
        floor.claimed(ClaimStart::FRONT, claim(10, Some((5, 14)), 200), t0);
        let slow = floor.start(t0);
        assert_eq!(slow.front, Some(at(5)));
        let t1 = t0 + Duration::from_secs(1);
        floor.claimed(slow, claim(10, None, 1), t1);
        assert_eq!(floor.start(t1), slow);
        assert_eq!(floor.walk_due_in(t1), Some(Duration::from_secs(3)));
        assert_eq!(floor.start(t0 + Duration::from_secs(4)), ClaimStart::FRONT);
        // Fast walks: an empty claim forgets the floor, and no walk is due
        // but the next claim's.
        let mut fast = ClaimFloor::default();
        fast.claimed(ClaimStart::FRONT, claim(10, Some((5, 14)), 1), t0);
        assert_eq!(fast.walk_due_in(t0), None);
        fast.claimed(fast.start(t0), claim(10, None, 1), t0);
        assert_eq!(fast.start(t0), ClaimStart::FRONT);
    }
}
