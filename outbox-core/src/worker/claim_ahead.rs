//! Claim-ahead: a queue's producer may hold a few claimed tasks beyond its
//! running slots, so that its next claim is in flight while the current
//! tasks run instead of after they finished. Throughput then no longer
//! hangs on the queue's concurrency: at concurrency 24 a claim can carry up
//! to `max_claim_batch` tasks, not just the slots free at that moment.
//!
//! The producer claims into a buffer; the dispatcher here starts the
//! buffered tasks, in claim order (priority, due time, id), as executor
//! slots free up. Buffered tasks are held like running ones: heartbeated,
//! fenced by their claim token, and counted by `explain` as running.
//!
//! The buffer is sized by time, not by count: it holds at most what this
//! worker starts in `claim_ahead_window` (measured over the last few
//! hundred milliseconds), capped at `claim_ahead`. Fast handlers get a
//! deep buffer; slow handlers (a second each, say) get one task ahead or
//! none, so a buffered task never waits long behind its queue's running
//! ones while another worker idles, and a higher-priority task that
//! arrives waits at most about one window. Queues with a global
//! concurrency or a rate get no buffer: their limits count claimed tasks.
//! Nor do queues with a per-key concurrency above 1, so that a key's
//! places go to tasks that start (see the producer).
//!
//! A run of a key's tasks (worker/runs.rs) keeps its place while each
//! task's outcome is written, neither running nor buffered then. The runs
//! waiting so are added to the buffer's size, up to that size again and
//! within the same cap: otherwise they take the buffer's places, and the
//! queue has fewer runs going than keys to run (the ordered drain of
//! `bench` went 15% faster in one sitting of five alternating runs, and
//! no faster beyond the noise in another; PERFORMANCE.md, "Runs waiting
//! for an outcome, and room for runs"). No more than that: the buffer
//! follows the pace, so when outcomes stall the waiting runs' places go
//! back to counting against it, and claiming stops as before (the
//! completer's backpressure).
//!
//! At shutdown the dispatcher stops starting tasks and gives the buffered
//! ones back at once (PENDING, no attempt counted), so that other workers
//! take them while this one's handlers finish.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Shared;
use super::executor::{self, Done};
use super::shutdown::{Release, release_until};
use crate::db::ClaimedTask;

/// The places a started task holds until its outcome is queued: an
/// executor slot (the queue's concurrency) and a place in the queue's
/// capacity (concurrency plus the claim-ahead buffer).
pub(crate) struct Places {
    _slot: OwnedSemaphorePermit,
    capacity: OwnedSemaphorePermit,
    /// The queue's count of runs waiting for an outcome.
    waiting_runs: Arc<AtomicUsize>,
}

impl Places {
    /// Frees the slot and keeps the place in the capacity, for the next
    /// task of a run (see worker/runs.rs), counted as a run waiting for an
    /// outcome until the run goes on or ends.
    pub(crate) fn wait_for_outcome(self) -> WaitingRun {
        self.waiting_runs.fetch_add(1, Ordering::Relaxed);
        WaitingRun {
            capacity: Some(self.capacity),
            waiting_runs: self.waiting_runs,
        }
    }
}

/// The place of a run whose task's outcome is being written. Dropped (the
/// run given back or held), it frees its place and is no longer counted.
#[derive(Debug)]
pub(crate) struct WaitingRun {
    capacity: Option<OwnedSemaphorePermit>,
    waiting_runs: Arc<AtomicUsize>,
}

impl WaitingRun {
    /// The run goes on: its place goes with its next task.
    pub(crate) fn resume(mut self) -> OwnedSemaphorePermit {
        self.capacity
            .take()
            .expect("a waiting run has its place until it resumes")
    }
}

impl Drop for WaitingRun {
    fn drop(&mut self) {
        self.waiting_runs.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A claimed task waiting for a slot, with its place in the capacity.
pub(crate) struct Buffered {
    pub(crate) task: ClaimedTask,
    pub(crate) capacity: OwnedSemaphorePermit,
}

/// How often the start rate behind the buffer's size is measured.
const RATE_SAMPLE: Duration = Duration::from_millis(200);

/// Sizes the buffer from the rate at which this worker starts the queue's
/// tasks, and the runs waiting for an outcome.
pub(crate) struct Sizer {
    max: usize,
    window: Duration,
    sampled_at: Instant,
    sampled: u64,
    /// Starts per second, smoothed.
    rate: f64,
}

impl Sizer {
    pub(crate) fn new(max: usize, window: Duration) -> Self {
        Self {
            max,
            window,
            sampled_at: Instant::now(),
            sampled: 0,
            rate: 0.0,
        }
    }

    /// The buffer this queue should have now, given the count of tasks
    /// started so far and the runs waiting for an outcome now.
    pub(crate) fn target(&mut self, started: u64, waiting_runs: usize, now: Instant) -> usize {
        let elapsed = now.saturating_duration_since(self.sampled_at);
        if elapsed >= RATE_SAMPLE {
            let window_rate = started.saturating_sub(self.sampled) as f64 / elapsed.as_secs_f64();
            // Rise at once (a burst should not wait for the average), fall
            // by halves (one slow sample should not empty the buffer).
            self.rate = window_rate.max(self.rate / 2.0);
            self.sampled_at = now;
            self.sampled = started;
        }
        // Rounded down: the tasks ahead are started, on average, within the
        // window.
        let wanted = (self.rate * self.window.as_secs_f64()).floor();
        let wanted = if wanted.is_finite() && wanted >= 0.0 {
            wanted as usize
        } else {
            0
        };
        // The waiting runs add at most the buffer's own size again, so that
        // they follow the pace too: when outcomes stall, the start rate and
        // with it this part fall, and claiming stops (see the module doc).
        wanted
            .saturating_add(waiting_runs.min(wanted))
            .min(self.max)
    }
}

/// Grows or shrinks the queue's capacity toward `concurrency + target`.
/// `ahead` is how many places beyond the concurrency the semaphore has
/// now; places in use are taken away as they come back, from `in_hand`
/// first (places the producer gathered for its next claim).
pub(crate) fn resize(
    capacity: &Semaphore,
    ahead: &mut usize,
    target: usize,
    in_hand: &mut Vec<OwnedSemaphorePermit>,
) {
    if target > *ahead {
        capacity.add_permits(target - *ahead);
        *ahead = target;
        return;
    }
    let mut excess = *ahead - target;
    while excess > 0
        && let Some(place) = in_hand.pop()
    {
        place.forget();
        excess -= 1;
        *ahead -= 1;
    }
    if excess > 0 {
        *ahead -= capacity.forget_permits(excess);
    }
}

/// Starts buffered tasks of one queue as its slots free up.
pub(crate) struct Dispatcher {
    pub(crate) shared: Arc<Shared>,
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) buffer: mpsc::UnboundedReceiver<Buffered>,
    pub(crate) started: Arc<AtomicU64>,
    /// The queue's count of runs waiting for an outcome (see
    /// [`WaitingRun`]).
    pub(crate) waiting_runs: Arc<AtomicUsize>,
    pub(crate) tracker: TaskTracker,
    pub(crate) done: mpsc::Sender<Done>,
    pub(crate) stop: CancellationToken,
}

pub(crate) async fn dispatch(d: Dispatcher) {
    let Dispatcher {
        shared,
        slots,
        mut buffer,
        started,
        waiting_runs,
        tracker,
        done,
        stop,
    } = d;
    let mut unstarted = Vec::new();
    loop {
        let next = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            next = buffer.recv() => match next {
                Some(next) => next,
                None => return,
            },
        };
        let slot = tokio::select! {
            biased;
            () = stop.cancelled() => {
                unstarted.push(next);
                break;
            }
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
        };
        started.fetch_add(1, Ordering::Relaxed);
        tracker.spawn(executor::execute(
            Arc::clone(&shared),
            next.task,
            done.clone(),
            Places {
                _slot: slot,
                capacity: next.capacity,
                waiting_runs: Arc::clone(&waiting_runs),
            },
        ));
    }
    // Shutdown: what is still buffered (and whatever a claim in flight adds
    // before the producer stops) goes back now.
    buffer.close();
    while let Some(next) = buffer.recv().await {
        unstarted.push(next);
    }
    give_back(&shared, unstarted).await;
}

/// Releases tasks claimed ahead whose handlers never started. What cannot
/// be released now stays held, and goes back with the rest of the worker's
/// holdings at the end of shutdown.
async fn give_back(shared: &Shared, unstarted: Vec<Buffered>) {
    if unstarted.is_empty() {
        return;
    }
    // With the runs claimed behind them.
    let tasks: Vec<(i64, Arc<str>)> = unstarted.iter().flat_map(|b| b.task.held()).collect();
    let give_up = tokio::time::Instant::now() + shared.deadline;
    let released = release_until(shared, give_up, Release::Tasks(&tasks)).await;
    match released {
        Ok(ids) => {
            for (id, token) in &tasks {
                shared.holdings.done(*id, token);
            }
            tracing::info!(
                released = ids.len(),
                "shutdown: gave back tasks claimed ahead that had not started"
            );
        }
        Err(why) => tracing::warn!(
            why,
            "could not give back the tasks claimed ahead yet; they are released with the \
             rest at the end of shutdown"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_follows_the_start_rate_within_its_cap() {
        let t0 = Instant::now();
        let mut sizer = Sizer::new(100, Duration::from_millis(50));
        assert_eq!(sizer.target(0, 0, t0), 0, "nothing measured yet: no buffer");
        // 24 slots of one-second handlers: a start every 42 ms, one task
        // ahead.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(sizer.target(24, 0, t1), 1);
        // No-op handlers: 20,000 a second, capped.
        let t2 = t1 + Duration::from_millis(500);
        assert_eq!(sizer.target(10_024, 0, t2), 100);
        // Idle: the estimate halves each sample instead of dropping to zero.
        let t3 = t2 + Duration::from_millis(200);
        assert_eq!(sizer.target(10_024, 0, t3), 100);
        let mut t = t3;
        for _ in 0..20 {
            t += Duration::from_millis(200);
            sizer.target(10_024, 0, t);
        }
        assert_eq!(sizer.target(10_024, 0, t), 0);
    }

    #[test]
    fn waiting_runs_add_to_the_buffer_up_to_its_own_size_within_its_cap() {
        let t0 = Instant::now();
        let mut sizer = Sizer::new(100, Duration::from_millis(50));
        // 400 starts a second: 20 ahead, and 15 runs waiting for their
        // outcomes on top.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(sizer.target(400, 15, t1), 35);
        // At most the buffer's own size again.
        assert_eq!(sizer.target(400, 30, t1), 40);
        assert_eq!(sizer.target(400, usize::MAX, t1), 40);
        // And within the cap.
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(sizer.target(2_000, 500, t2), 100);
        // Outcomes stall: nothing starts, and however many runs wait, the
        // buffer shrinks as the rate does, to nothing.
        let mut t = t2;
        for _ in 0..20 {
            t += Duration::from_millis(200);
            sizer.target(2_000, 1_000, t);
        }
        assert_eq!(sizer.target(2_000, 1_000, t), 0);
    }

    #[test]
    fn a_waiting_run_is_counted_until_it_resumes_or_is_dropped() {
        let capacity = Arc::new(Semaphore::new(2));
        let slots = Arc::new(Semaphore::new(2));
        let waiting_runs = Arc::new(AtomicUsize::new(0));
        let places = |capacity: &Arc<Semaphore>| Places {
            _slot: Arc::clone(&slots).try_acquire_owned().unwrap(),
            capacity: Arc::clone(capacity).try_acquire_owned().unwrap(),
            waiting_runs: Arc::clone(&waiting_runs),
        };
        let (first, second) = (
            places(&capacity).wait_for_outcome(),
            places(&capacity).wait_for_outcome(),
        );
        assert_eq!(waiting_runs.load(Ordering::Relaxed), 2);
        assert_eq!(slots.available_permits(), 2, "a waiting run frees its slot");
        assert_eq!(capacity.available_permits(), 0, "and keeps its place");
        let place = first.resume();
        assert_eq!(waiting_runs.load(Ordering::Relaxed), 1);
        assert_eq!(
            capacity.available_permits(),
            0,
            "the place goes on with the run"
        );
        drop(place);
        drop(second);
        assert_eq!(waiting_runs.load(Ordering::Relaxed), 0);
        assert_eq!(capacity.available_permits(), 2);
    }

    #[test]
    fn resizing_takes_places_back_as_they_return() {
        let capacity = Arc::new(Semaphore::new(10));
        let mut ahead = 0;
        let mut in_hand = Vec::new();
        resize(&capacity, &mut ahead, 5, &mut in_hand);
        assert_eq!((ahead, capacity.available_permits()), (5, 15));
        // Three places in hand and 12 in use elsewhere: shrinking to zero
        // forgets the three in hand and two more as they come back.
        let mut elsewhere = Arc::clone(&capacity).try_acquire_many_owned(12).unwrap();
        in_hand = (0..3)
            .map(|_| Arc::clone(&capacity).try_acquire_owned().unwrap())
            .collect();
        resize(&capacity, &mut ahead, 0, &mut in_hand);
        assert_eq!((ahead, in_hand.len()), (2, 0));
        drop(elsewhere.split(2).unwrap());
        resize(&capacity, &mut ahead, 0, &mut in_hand);
        assert_eq!((ahead, capacity.available_permits()), (0, 0));
        drop(elsewhere);
        assert_eq!(capacity.available_permits(), 10);
    }
}
