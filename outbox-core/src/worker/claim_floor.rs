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
//!
//! A producer that has just started has no floor, and its first claim
//! would walk the whole index. So a slow walk's front is also written to
//! the database (migration 35), and a producer of that queue that starts
//! while the walk's floor would still last begins where the walk began,
//! and walks when that walk falls due ([`ClaimFloor::seeded`]); the first
//! task its first claim finds is its front, as a walk's first would be:
//! a worker restarted beside a long-held snapshot does not pay a walk at
//! every start, and no task waits longer than behind the walker's own
//! floor.

use std::time::{Duration, Instant};

use crate::db::claim_fronts::WalkedFront;
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
    /// The floor of a producer that has just started, from the last slow
    /// walk of its queue's index by any producer (migration 35): it starts
    /// where that walk found its first task, reads below that no further,
    /// and walks the whole index when the walk's floor lapses, as the
    /// producer that walked would. None (the first claim walks) when the
    /// walk was fast or its floor has lapsed.
    pub(crate) fn seeded(walked: Option<WalkedFront>, now: Instant) -> Self {
        let Some(w) = walked.filter(|w| w.took >= SLOW_WALK) else {
            return Self::default();
        };
        let floor = Self {
            at: None,
            walk: w.took,
            front: Some(w.front),
        };
        match now.checked_sub(w.age) {
            // The floor just before the walk's first task: claims read
            // from that task on.
            Some(since) if w.age < floor.max_age() => Self {
                at: Some((w.front.just_before(), since)),
                ..floor
            },
            _ => Self::default(),
        }
    }

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
        self.walk
            .saturating_mul(WALK_SHARE)
            .clamp(FLOOR_MAX_AGE, FLOOR_MAX_AGE_CAP)
    }

    /// Records a claim that started at `start`. Returns where it found its
    /// first task when it was a slow walk of the whole index: worth telling
    /// the queue's producers that start later (migration 35).
    pub(crate) fn claimed(
        &mut self,
        start: ClaimStart,
        claim: Claim,
        now: Instant,
    ) -> Option<ClaimPosition> {
        // A claim from the front, or one that came up short having read
        // all below the floor, walked the whole index: nothing has waited
        // in it since `now`, and its time is what a walk costs now.
        let walked =
            start == ClaimStart::FRONT || (claim.got < claim.wanted && start.front.is_none());
        if walked {
            self.walk = claim.took;
            self.front = claim.first;
        } else if let Some(front) = start.front
            && start.floor < front
            && let Some(first) = claim.first.filter(|f| f.priority == front.priority)
        {
            // The first claim of a producer that started where another's
            // walk began (`seeded`) read from that walk's front on, as a
            // walk would have: its first task is the front now, as a
            // walk's would be. The claims that come up short at the end
            // of a drain then read from there, not from a front many
            // drains old. (Other claims leave the front: one that came up
            // short would find there a task whose submit committed late.)
            self.front = Some(first.max(front));
        }
        let Some(last) = claim.last else {
            if start.front.is_none() {
                // Nothing claimable: the next claim walks the whole index.
                self.at = None;
            }
            // Read from the front, nothing found: tasks may still wait
            // before it, so the floor stays and its walk stays due
            // (`walk_due_in`).
            return None;
        };
        let since = match self.at {
            Some((_, since)) if !walked => since,
            _ => now,
        };
        self.at = Some((last, since));
        claim.first.filter(|_| walked && claim.took >= SLOW_WALK)
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

    fn walked(front: i64, took_ms: u64, age_ms: u64) -> Option<WalkedFront> {
        Some(WalkedFront {
            front: at(front),
            took: Duration::from_millis(took_ms),
            age: Duration::from_millis(age_ms),
        })
    }

    #[test]
    fn only_slow_walks_are_told_to_the_queues_later_producers() {
        let t0 = Instant::now();
        let mut floor = ClaimFloor::default();
        assert_eq!(
            floor.claimed(ClaimStart::FRONT, claim(10, Some((5, 14)), 99), t0),
            None
        );
        assert_eq!(
            floor.claimed(ClaimStart::FRONT, claim(10, Some((5, 14)), 200), t0),
            Some(at(5))
        );
        // Above the floor, or from the front: no walk.
        let slow = floor.start(t0);
        assert_eq!(
            floor.claimed(slow, claim(10, Some((15, 24)), 500), t0),
            None
        );
        // A walk that found nothing has no front to tell.
        assert_eq!(
            floor.claimed(ClaimStart::FRONT, claim(10, None, 500), t0),
            None
        );
    }

    #[test]
    fn a_started_producer_begins_where_a_recent_slow_walk_did_and_walks_when_it_falls_due() {
        let t0 = Instant::now() + Duration::from_secs(60);
        // A walk of 200 ms that ended 1 s ago: its floor lasts 4 s, so 3 s
        // more here, reading below it from task 5 only.
        let floor = ClaimFloor::seeded(walked(5, 200, 1_000), t0);
        let start = ClaimStart {
            floor: at(4),
            front: Some(at(5)),
        };
        assert_eq!(floor.start(t0), start);
        assert_eq!(floor.walk_due_in(t0), Some(Duration::from_secs(3)));
        assert_eq!(floor.start(t0 + Duration::from_millis(2_900)), start);
        assert_eq!(floor.start(t0 + Duration::from_secs(3)), ClaimStart::FRONT);
        // Its claims go on above it (the first read from the front on: the
        // front is the first task it found), and the walk stays due.
        let mut floor = floor;
        assert_eq!(floor.claimed(start, claim(10, Some((6, 15)), 1), t0), None);
        assert_eq!(
            floor.start(t0 + Duration::from_millis(2_900)),
            ClaimStart {
                floor: at(15),
                front: Some(at(6)),
            }
        );
        assert_eq!(floor.start(t0 + Duration::from_secs(3)), ClaimStart::FRONT);
    }

    #[test]
    fn a_started_producers_first_claim_moves_the_front_to_its_first_task() {
        let t0 = Instant::now() + Duration::from_secs(60);
        // A producer started where a walk began (task 5): its first claim
        // reads from there and finds task 100 first.
        let mut floor = ClaimFloor::seeded(walked(5, 200, 0), t0);
        floor.claimed(floor.start(t0), claim(10, Some((100, 109)), 1), t0);
        assert_eq!(
            floor.start(t0),
            ClaimStart {
                floor: at(109),
                front: Some(at(100)),
            }
        );
        // Later claims, full or short, leave it.
        floor.claimed(floor.start(t0), claim(10, Some((110, 119)), 1), t0);
        assert_eq!(floor.start(t0).front, Some(at(100)));
        floor.claimed(floor.start(t0), claim(10, Some((150, 152)), 1), t0);
        assert_eq!(
            floor.start(t0),
            ClaimStart {
                floor: at(152),
                front: Some(at(100)),
            }
        );
        // The walk stays due when it was.
        assert_eq!(floor.walk_due_in(t0), Some(Duration::from_secs(4)));
    }

    #[test]
    fn a_started_producer_walks_first_after_no_walk_a_fast_one_or_a_lapsed_one() {
        let t0 = Instant::now() + Duration::from_secs(60);
        for (hint, why) in [
            (None, "no walk recorded"),
            (walked(5, 99, 0), "a fast walk"),
            (walked(5, 200, 4_000), "a walk whose floor lapsed"),
            (
                walked(5, 60_000, 30_000),
                "a walk older than the longest floor",
            ),
        ] {
            let floor = ClaimFloor::seeded(hint, t0);
            assert_eq!(floor.start(t0), ClaimStart::FRONT, "{why}");
        }
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
