//! Random numbers for names and spreads (a run's id, a retry's jitter, a
//! backoff): unpredictable enough to keep workers apart, not for secrets.

use std::hash::{BuildHasher, RandomState};

/// A random 64-bit number. Each `RandomState` is keyed afresh (randomly per
/// thread, then one more each call), so calls in one instant differ too.
pub(crate) fn u64() -> u64 {
    RandomState::new().hash_one(std::time::Instant::now())
}
