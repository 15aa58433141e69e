//! Keeps this worker's tasks alive: one UPDATE per interval for all of
//! them, so the cost does not grow with concurrency. "All of them" includes
//! tasks whose handler has returned but whose outcome is still waiting to
//! be written (the database may be away): they are still this worker's,
//! and recovery must not hand them to another worker meanwhile.
//!
//! Its answer also names held tasks an operator asked to cancel: the
//! fallback when the cancel's NOTIFY did not reach this worker.
//!
//! And it is how the worker knows its tasks are still its own. Recovery
//! elsewhere may take a task once its heartbeat is `heartbeat_timeout`
//! old, so a worker cut off from the database (a partition, a silent
//! network) must not run its handlers on past that: another worker would
//! run the same task, or the next of its ordering key, at the same time.
//! When no heartbeat has been confirmed for three quarters of the timeout
//! less the cancel grace (at least half the timeout), the worker lets go
//! of everything it holds: the handlers' cancellation tokens fire, they
//! are aborted after the cancel grace, tasks claimed ahead never start,
//! and each task is put back (PENDING, no attempt counted) once the
//! database takes the outcome, which the claim's fence turns into nothing
//! if the task was taken over meanwhile. A heartbeat that finds a held
//! task gone (recovered) lets go of that one the same way. When the
//! database itself was down, nobody recovered anything, and the tasks
//! simply run again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::outage::Outage;
use crate::db::{self, session::call};

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let (confirmed, watched) = watch::channel(Instant::now());
    let guard = tokio::spawn(let_go_when_unconfirmed(
        Arc::clone(&shared),
        watched,
        stop.clone(),
    ));
    beat(&shared, &confirmed, &stop).await;
    let _ = guard.await;
}

/// The heartbeat loop; `confirmed` is told each moment from which the
/// worker's holds are vouched for.
async fn beat(shared: &Arc<Shared>, confirmed: &watch::Sender<Instant>, stop: &CancellationToken) {
    let mut outage = Outage::new("heartbeat");
    loop {
        tokio::select! {
            () = tokio::time::sleep(shared.config.heartbeat_interval) => {}
            () = stop.cancelled() => return,
        }
        let sent = Instant::now();
        let (ids, tokens) = shared.holdings.heartbeat_targets();
        if ids.is_empty() {
            // Nothing held: nothing to vouch for.
            confirmed.send_replace(sent);
            continue;
        }
        shared.counters.heartbeat();
        let now = shared.config.clock.now();
        let call = call(&shared.engine, shared.deadline, "heartbeat", async |conn| {
            db::heartbeat(conn, &ids, &tokens, now).await
        });
        let result = tokio::select! {
            r = call => r,
            () = stop.cancelled() => return,
        };
        match result {
            Ok(beat) => {
                outage.ok();
                // Every task asked about that is still held had its
                // heartbeat written at or after `sent`.
                confirmed.send_replace(sent);
                // The fallback for a cancel whose NOTIFY this worker missed.
                for id in beat.cancel {
                    if shared.holdings.request_cancel(id) {
                        tracing::info!(
                            task_id = id,
                            "cancel requested by an operator (seen by the heartbeat)"
                        );
                    }
                }
                let kept: HashSet<i64> = beat.kept.into_iter().collect();
                let gone: HashSet<i64> = ids.into_iter().filter(|id| !kept.contains(id)).collect();
                if !gone.is_empty() {
                    let_go(shared, Some(&gone), "the heartbeat found them taken over");
                }
            }
            // The next interval tries again; recovery only steps in after
            // the (much longer) heartbeat timeout.
            Err(error) => {
                let _ = outage.failed(&error);
            }
        }
    }
}

/// How long after its last confirmed heartbeat the worker still vouches
/// for its holds: three quarters of the heartbeat timeout, less the cancel
/// grace its handlers get to stop in, and never less than half the
/// timeout (a timeout of a few seconds leaves the abort after the timeout;
/// the handlers are still told to stop before it).
fn hold_for(timeout: Duration, cancel_grace: Duration) -> Duration {
    (timeout * 3 / 4)
        .saturating_sub(cancel_grace)
        .max(timeout / 2)
}

/// Lets go of everything held whenever no heartbeat was confirmed for
/// [`hold_for`]; then waits for the next confirmation.
async fn let_go_when_unconfirmed(
    shared: Arc<Shared>,
    mut confirmed: watch::Receiver<Instant>,
    stop: CancellationToken,
) {
    let hold_for = hold_for(shared.config.heartbeat_timeout, shared.config.cancel_grace);
    loop {
        let deadline = *confirmed.borrow_and_update() + hold_for;
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {}
            changed = confirmed.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            () = stop.cancelled() => return,
        }
        let_go(
            &shared,
            None,
            "no heartbeat was confirmed for three quarters of the heartbeat timeout",
        );
        // Armed again by the next confirmation.
        tokio::select! {
            changed = confirmed.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = stop.cancelled() => return,
        }
    }
}

/// Lets go of the held attempts (`only`: of these tasks), and aborts the
/// handlers still running after the cancel grace.
fn let_go(shared: &Arc<Shared>, only: Option<&HashSet<i64>>, why: &str) {
    let n = shared.holdings.let_go(only);
    if n == 0 {
        return;
    }
    tracing::warn!(
        tasks = n,
        "letting go of tasks this worker can no longer vouch for ({why}): their handlers are \
         asked to stop and the tasks are put back"
    );
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        tokio::time::sleep(shared.config.cancel_grace).await;
        let aborted = shared.holdings.abort_let_go();
        if aborted > 0 {
            tracing::warn!(
                handlers = aborted,
                "aborted handlers that did not stop within the cancel grace"
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::hold_for;

    #[test]
    fn the_hold_ends_before_the_timeout_and_not_before_half_of_it() {
        let s = Duration::from_secs;
        // The defaults: 5 minutes, 1 s grace.
        assert_eq!(hold_for(s(300), s(1)), s(224));
        assert_eq!(hold_for(s(4), s(1)), s(2));
        assert_eq!(hold_for(s(1), s(1)), Duration::from_millis(500));
        assert_eq!(hold_for(s(2), s(10)), s(1));
    }
}
