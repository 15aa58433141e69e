//! One producer per queue: waits for free executor slots, claims that many
//! due tasks in one TX1, and hands them to the executor. It sleeps until a
//! NOTIFY for its queue or the fallback poll, whichever comes first.

use std::sync::Arc;

use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Shared;
use super::executor::{self, Done};
use super::outage::Outage;
use crate::db;

pub(crate) async fn run(
    shared: Arc<Shared>,
    queue: String,
    concurrency: usize,
    waker: Arc<Notify>,
    stop: CancellationToken,
    tracker: TaskTracker,
    done: mpsc::Sender<Done>,
) {
    let slots = Arc::new(Semaphore::new(concurrency));
    let mut outage = Outage::new("producer");
    loop {
        // Wait for at least one free slot, then take every free one (up to
        // the batch cap): the claim is sized to what can run now.
        let first = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return,
            },
            () = stop.cancelled() => return,
        };
        let mut permits = vec![first];
        while permits.len() < shared.config.max_claim_batch {
            match Arc::clone(&slots).try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let wanted = permits.len();
        let claimed = db::claim_tasks(
            &shared.pool,
            &queue,
            wanted,
            &shared.config.worker_id,
            shared.config.clock.now(),
        )
        .await;
        let got = match claimed {
            Ok(tasks) => {
                outage.ok();
                shared.counters.claimed(tasks.len());
                let got = tasks.len();
                for task in tasks {
                    let Some(permit) = permits.pop() else { break };
                    tracker.spawn(executor::execute(
                        Arc::clone(&shared),
                        task,
                        done.clone(),
                        permit,
                    ));
                }
                got
            }
            Err(error) => {
                let backoff = outage.failed(&error);
                drop(permits);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => continue,
                    () = stop.cancelled() => return,
                }
            }
        };
        drop(permits);
        if got == wanted {
            // A full claim: there is probably more; claim again at once.
            continue;
        }
        tokio::select! {
            () = waker.notified() => {}
            () = tokio::time::sleep(shared.config.poll_interval) => {}
            () = stop.cancelled() => return,
        }
    }
}
