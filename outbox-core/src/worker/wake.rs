//! What wakes a queue's producer from its wait between claims: a NOTIFY
//! for the queue (from the listener), the fallback poll, or the due time of
//! a retry or snooze this worker wrote itself. Without the last, a retry
//! due in 2 s would wait for the next poll after that; with it, the worker
//! looks again the moment its own retries come due.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The wakers of every queue a worker serves, by queue name.
pub(crate) type Wakers = Arc<HashMap<String, Arc<QueueWaker>>>;

/// Most due times remembered per queue; past it the latest are forgotten
/// and found by the poll instead.
const MAX_DUE_TIMES: usize = 1024;

/// One queue's wake-up signals.
#[derive(Default)]
pub(crate) struct QueueWaker {
    notify: Notify,
    /// Known future due times, earliest first.
    due: Mutex<BinaryHeap<Reverse<Instant>>>,
    /// A due time earlier than every one known was added: a wait in
    /// progress sets its alarm again (without ending, which would cost a
    /// claim that finds nothing due yet).
    sooner: Notify,
}

impl QueueWaker {
    /// Wakes the producer now (a NOTIFY, or a reconnected listener).
    pub(crate) fn notify_one(&self) {
        self.notify.notify_one();
    }

    /// Remembers that a task of this queue becomes due at `at`.
    pub(crate) fn due_at(&self, at: Instant) {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        if due.len() >= MAX_DUE_TIMES {
            let Some(&Reverse(latest)) = due.iter().max_by_key(|Reverse(t)| *t) else {
                return;
            };
            if at >= latest {
                return;
            }
            due.retain(|Reverse(t)| *t != latest);
        }
        let sooner = due.peek().is_none_or(|Reverse(first)| at < *first);
        due.push(Reverse(at));
        drop(due);
        if sooner {
            self.sooner.notify_waiters();
        }
    }

    /// Waits for a notification, the earliest known due time, or `poll`,
    /// whichever comes first. Due times that have passed are forgotten.
    pub(crate) async fn wait(&self, poll: Duration) {
        let end = Instant::now() + poll;
        loop {
            // Registered before the due times are read, so a sooner one
            // added from now on is not missed.
            let sooner = self.sooner.notified();
            let now = Instant::now();
            let mut until = end;
            {
                let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
                while due.peek().is_some_and(|Reverse(t)| *t <= now) {
                    due.pop();
                }
                if let Some(&Reverse(next)) = due.peek() {
                    until = until.min(next);
                }
            }
            tokio::select! {
                () = self.notify.notified() => return,
                () = tokio::time::sleep_until(until) => return,
                () = sooner => {}
            }
        }
    }
}

pub(crate) fn for_queues<'a>(queues: impl IntoIterator<Item = &'a String>) -> Wakers {
    Arc::new(
        queues
            .into_iter()
            .map(|q| (q.clone(), Arc::new(QueueWaker::default())))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_known_due_time_ends_the_wait_before_the_poll() {
        let waker = QueueWaker::default();
        let start = Instant::now();
        waker.due_at(start + Duration::from_millis(300));
        waker.due_at(start + Duration::from_millis(100));
        waker.wait(Duration::from_secs(10)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        waker.wait(Duration::from_secs(10)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        waker.wait(Duration::from_secs(10)).await;
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(10_300),
            "then the poll"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_due_time_learned_during_a_wait_ends_it_on_time() {
        let waker = Arc::new(QueueWaker::default());
        let start = Instant::now();
        let waiting = tokio::spawn({
            let waker = Arc::clone(&waker);
            async move { waker.wait(Duration::from_secs(600)).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // A retry written while the producer already sleeps.
        waker.due_at(start + Duration::from_millis(300));
        waiting.await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_notification_ends_the_wait_at_once() {
        let waker = QueueWaker::default();
        let start = Instant::now();
        waker.notify_one();
        waker.wait(Duration::from_secs(10)).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[test]
    fn the_memory_of_due_times_is_bounded_and_keeps_the_earliest() {
        let waker = QueueWaker::default();
        let start = Instant::now();
        for i in 0..(MAX_DUE_TIMES as u64 + 10) {
            waker.due_at(start + Duration::from_secs(1000 - i % 1000));
        }
        let due = waker.due.lock().unwrap();
        assert_eq!(due.len(), MAX_DUE_TIMES);
        assert_eq!(due.peek(), Some(&Reverse(start + Duration::from_secs(1))));
    }
}
