//! Hand-on: a successful outcome that lets go of an ordering key may claim
//! the key's next task in the same statement, for this worker (migration 17
//! says when the database agrees). A hot key then runs at the pace of one
//! outcome statement per task, instead of an outcome, a wake-up and a claim.
//! The task taken comes with the tasks waiting behind it in its key's line,
//! up to the worker's `key_run` in all, as a claim takes them: a run
//! (worker/runs.rs, migration 46). So the last task of a run hands its key
//! straight on to the next run.
//!
//! The completer offers, per queue, at most as many places as the queue has
//! idle executor slots (a free slot means nothing claimed is waiting to
//! start), taking them from the queue's capacity (the same places a claim
//! takes: concurrency plus the claim-ahead buffer) without waiting. So a
//! hand-on never oversubscribes a queue, never slows an outcome down, and
//! never takes a place the producer is waiting for: the capacity is a fair
//! semaphore, so a producer that knows of a task to claim gets the next
//! free place before any offer can. What the statement claims goes to the
//! queue's dispatcher like any claimed task, in the worker's holdings under
//! the offer's claim token; places not used go back when the statement
//! returns.
//!
//! The database takes a handed task only if no claimable task of its queue
//! has a higher priority. An older task of the same priority that the
//! producer has not heard of yet (a due time passing, no LISTEN) waits for
//! the producer's next poll, while the key goes on here. Once claiming
//! stops (shutdown), nothing is offered.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::claim_ahead::Buffered;
use super::holdings::Holdings;
use crate::db::{ClaimedTask, HandOnOffer};

/// One queue's way in: its capacity and its dispatcher's buffer (a clone
/// shares them).
#[derive(Clone)]
pub(crate) struct Lane {
    pub(crate) capacity: Arc<Semaphore>,
    pub(crate) to_dispatch: mpsc::UnboundedSender<Buffered>,
    /// The executor slots of the queue (its concurrency); the dispatcher
    /// takes one to start each task.
    pub(crate) slots: Arc<Semaphore>,
}

/// The queues a completion can hand tasks on to.
pub(crate) struct HandOn {
    lanes: HashMap<String, Lane>,
    /// Claiming stopped: no more offers.
    stop: CancellationToken,
    /// How many of a key's tasks a task handed on brings, itself included.
    run_length: i32,
}

/// An offer made, with the places it holds until its statement returns.
pub(crate) struct Offer {
    pub(crate) offer: HandOnOffer,
    places: HashMap<String, Vec<OwnedSemaphorePermit>>,
}

impl HandOn {
    pub(crate) fn new(
        lanes: HashMap<String, Lane>,
        stop: CancellationToken,
        key_run: usize,
    ) -> Self {
        Self {
            lanes,
            stop,
            run_length: i32::try_from(key_run).unwrap_or(i32::MAX),
        }
    }

    /// Claiming stopped (shutdown): no run goes on either.
    pub(crate) fn stopped(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Sends the next task of a run to its queue's dispatcher, with the
    /// run's place in the capacity; if the dispatcher stopped, returns what
    /// the run still holds, (id, claim token) each, to give back.
    pub(crate) fn run_on(&self, next: Buffered) -> Result<(), Vec<(i64, Arc<str>)>> {
        match self.lanes.get(&next.task.queue) {
            Some(lane) => lane
                .to_dispatch
                .send(next)
                .map_err(|refused| refused.0.task.held().collect()),
            None => Err(next.task.held().collect()),
        }
    }

    /// An offer for successes of ordered tasks in `queues` (one entry per
    /// success), or `None` when there is nothing to offer.
    pub(crate) fn offer<'a>(
        &self,
        holdings: &Holdings,
        queues: impl Iterator<Item = &'a str>,
    ) -> Option<Offer> {
        if self.stop.is_cancelled() {
            return None;
        }
        let mut wanted: HashMap<&str, usize> = HashMap::new();
        for queue in queues {
            *wanted.entry(queue).or_default() += 1;
        }
        let mut places = HashMap::new();
        for (queue, n) in wanted {
            let Some(lane) = self.lanes.get(queue) else {
                continue;
            };
            let idle = lane.slots.available_permits();
            let taken: Vec<_> = (0..n.min(idle))
                .map_while(|_| Arc::clone(&lane.capacity).try_acquire_owned().ok())
                .collect();
            if !taken.is_empty() {
                places.insert(queue.to_owned(), taken);
            }
        }
        if places.is_empty() {
            return None;
        }
        let (queues, counts) = places
            .iter()
            .map(|(q, p)| (q.clone(), i32::try_from(p.len()).unwrap_or(i32::MAX)))
            .unzip();
        Some(Offer {
            offer: HandOnOffer {
                queues,
                places: counts,
                token: holdings.begin_claim(),
                run_length: self.run_length,
            },
            places,
        })
    }
}

impl Offer {
    /// The statement answered: the claimed tasks (with their runs) are held
    /// and go to their queues' dispatchers, each with one of the offer's
    /// places; the rest of the places go back. Returns how many were handed
    /// on (runs not counted).
    pub(crate) fn deliver(
        mut self,
        hand_on: &HandOn,
        holdings: &Holdings,
        claimed: Vec<ClaimedTask>,
    ) -> usize {
        holdings.settle(&self.offer.token, &claimed);
        let n = claimed.len();
        for task in claimed {
            let place = self.places.get_mut(&task.queue).and_then(Vec::pop);
            let lane = hand_on.lanes.get(&task.queue);
            match (place, lane) {
                (Some(capacity), Some(lane)) => {
                    // Only fails when the dispatcher stopped (shutdown): the
                    // task stays held and is released with the rest.
                    let _ = lane.to_dispatch.send(Buffered { task, capacity });
                }
                // The database claimed more than was offered: it cannot
                // (it counts places per queue), but if it did, the task
                // stays held and runs nowhere until shutdown releases it
                // or recovery returns it. Say so loudly.
                _ => tracing::error!(
                    task_id = task.id,
                    queue = task.queue,
                    "a hand-on claimed a task beyond the places offered"
                ),
            }
        }
        n
    }

    /// The statement failed: handled as a failed claim (what it may have
    /// claimed is released before the next claim).
    pub(crate) fn fail(self, holdings: &Holdings, error: &sqlx::Error) {
        holdings.claim_failed(&self.offer.token, error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hand_on(places: usize) -> (HandOn, mpsc::UnboundedReceiver<Buffered>, CancellationToken) {
        let (to_dispatch, buffer) = mpsc::unbounded_channel();
        let lane = Lane {
            capacity: Arc::new(Semaphore::new(places)),
            to_dispatch,
            slots: Arc::new(Semaphore::new(places)),
        };
        let stop = CancellationToken::new();
        let lanes = HashMap::from([("q".to_owned(), lane)]);
        (HandOn::new(lanes, stop.clone(), 16), buffer, stop)
    }

    #[test]
    fn an_offer_takes_only_free_places_of_served_queues_and_gives_them_back() {
        let holdings = Holdings::new("w");
        let (hand_on, _buffer, stop) = hand_on(2);
        let first = hand_on
            .offer(&holdings, ["q", "q", "q", "elsewhere"].into_iter())
            .expect("an offer");
        assert_eq!(first.offer.queues, vec!["q".to_owned()]);
        assert_eq!(first.offer.places, vec![2], "two places free, not three");
        assert!(
            hand_on.offer(&holdings, ["q"].into_iter()).is_none(),
            "no place left"
        );
        // Nothing claimed: the places go back.
        assert_eq!(first.deliver(&hand_on, &holdings, Vec::new()), 0);
        assert!(hand_on.offer(&holdings, ["q"].into_iter()).is_some());
        let busy = Arc::clone(&hand_on.lanes["q"].slots)
            .try_acquire_many_owned(2)
            .unwrap();
        assert!(
            hand_on.offer(&holdings, ["q"].into_iter()).is_none(),
            "no offer while every slot is busy"
        );
        drop(busy);
        stop.cancel();
        assert!(
            hand_on.offer(&holdings, ["q"].into_iter()).is_none(),
            "no offer once claiming stopped"
        );
    }
}
