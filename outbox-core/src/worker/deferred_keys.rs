//! Ordering keys owed a hand-over that their outcome could not make.
//!
//! An outcome that lets go of a key waits for the key's row 50 ms at most
//! (migration 23): while another transaction holds it for longer (an
//! application's submit of the key, still open), the outcome is written
//! without the hand-over and the key comes here, so that one open
//! transaction never holds up a batch of outcomes of other keys and queues.
//! This loop tries the owed keys again, on one session, waiting 10 ms at
//! most for their rows: at once when a key arrives, then after pauses that
//! double from 5 ms to half a second while the same keys stay held. A key goes on as
//! soon as its row is free (the holder's own task, if it added one, was
//! queued behind the key and is handed it then), and the queue's producer
//! here looks for its next task at once.
//!
//! Nothing owed is dropped for a transient error: the keys are kept and
//! tried again after the outage's backoff. What is still owed when the
//! worker stops (one last try once every outcome is written, so that
//! another transaction's lock does not hold up its exit), or when it dies,
//! or when the reply of the outcome that owed it was lost, is handed on by
//! the maintenance leader, which advances every key with waiting tasks and
//! a free place each cleanup round.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::outage::Outage;
use crate::db::{self, QueueKey, classify::is_transient, session::call};

/// The first pause while keys stay held; each further one twice as long.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
/// No pause is longer than this: the longest a key waits after its row is
/// freed.
const MAX_PAUSE: Duration = Duration::from_millis(500);
/// A key owed for this long is logged, once: a transaction has held its
/// row that long, and the key's next task waits for it.
const WARN_AFTER: Duration = Duration::from_secs(10);

/// One key owed a hand-over.
struct Owed {
    since: Instant,
    warned: bool,
}

/// Hands on the keys that arrive on `incoming` until it closes and none is
/// owed, or until `give_up`.
pub(crate) async fn run(
    shared: Arc<Shared>,
    mut incoming: mpsc::UnboundedReceiver<QueueKey>,
    give_up: CancellationToken,
) {
    let mut owed: BTreeMap<QueueKey, Owed> = BTreeMap::new();
    let mut outage = Outage::new("key hand-over");
    let mut pause = FIRST_PAUSE;
    let mut open = true;
    loop {
        if owed.is_empty() {
            if !open {
                return;
            }
            let next = tokio::select! {
                k = incoming.recv(), if open => k,
                () = give_up.cancelled() => None,
            };
            let Some(key) = next else { return };
            add(&mut owed, key);
            pause = FIRST_PAUSE;
        }
        while let Ok(key) = incoming.try_recv() {
            add(&mut owed, key);
        }
        let keys: Vec<QueueKey> = owed.keys().cloned().collect();
        let attempt = call(
            &shared.engine,
            shared.deadline,
            "key hand-over",
            async |conn| db::hand_on_deferred_keys(conn, &keys).await,
        );
        let result = tokio::select! {
            r = attempt => r,
            () = give_up.cancelled() => return left_to_maintenance(&owed),
        };
        let wait = match result {
            Ok(still) => {
                outage.ok();
                let still: HashSet<QueueKey> = still.into_iter().collect();
                let before = owed.len();
                owed.retain(|key, _| {
                    let handed = !still.contains(key);
                    if handed && let Some(waker) = shared.wakers.get(key.0.as_str()) {
                        // Its next task may be this worker's to claim: look
                        // now, not at the next NOTIFY or poll.
                        waker.notify_one();
                    }
                    !handed
                });
                pause = if owed.len() < before {
                    FIRST_PAUSE
                } else {
                    (pause * 2).min(MAX_PAUSE)
                };
                warn_of_long_held(&mut owed);
                pause
            }
            Err(error) if is_transient(&error) => outage.failed(&error),
            Err(error) => {
                // A bug or bad data: retrying will not help. Maintenance's
                // advance of every waiting key still hands them on.
                tracing::error!(%error, keys = ?keys, "could not hand on ordering keys; the maintenance leader will");
                owed.clear();
                continue;
            }
        };
        if owed.is_empty() {
            continue;
        }
        if !open {
            // Every lane has ended (shutdown): this was the last try, so
            // that another transaction's lock does not hold up the exit.
            return left_to_maintenance(&owed);
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            k = incoming.recv(), if open => match k {
                Some(key) => add(&mut owed, key),
                None => open = false,
            },
            () = give_up.cancelled() => return left_to_maintenance(&owed),
        }
    }
}

/// Logs the keys still owed when the worker stops trying.
fn left_to_maintenance(owed: &BTreeMap<QueueKey, Owed>) {
    tracing::warn!(
        keys = ?owed.keys().collect::<Vec<_>>(),
        "ordering keys still held by other transactions as the worker stops; the maintenance leader will hand them on"
    );
}

fn add(owed: &mut BTreeMap<QueueKey, Owed>, key: QueueKey) {
    owed.entry(key).or_insert_with(|| Owed {
        since: Instant::now(),
        warned: false,
    });
}

/// Logs each key owed for longer than [`WARN_AFTER`], once.
fn warn_of_long_held(owed: &mut BTreeMap<QueueKey, Owed>) {
    for ((queue, key), o) in owed.iter_mut() {
        if !o.warned && o.since.elapsed() >= WARN_AFTER {
            o.warned = true;
            tracing::warn!(
                queue = %queue,
                ordering_key = %key,
                held_for_s = o.since.elapsed().as_secs(),
                "another transaction has held this ordering key's lock for long (an open submit of the key?): its next task waits until it ends"
            );
        }
    }
}
