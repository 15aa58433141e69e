//! One producer per queue: waits for free places in the queue's capacity
//! (its executor slots plus the claim-ahead buffer, see `claim_ahead`),
//! claims that many due tasks in one TX1, and hands them to the queue's
//! dispatcher, which starts them as slots free up. It sleeps until a
//! NOTIFY for its queue, the fallback poll, or the due time of a retry it
//! wrote itself, whichever comes first (see `wake`).
//!
//! Before claiming, it reads the queue's settings in the database (at most
//! a second old): a paused queue is not claimed, and a queue with a global
//! concurrency or a rate is claimed under its row's lock by
//! `claim_limited.sql` (see `db::queues`). The plain claim checks the
//! settings itself, so a pause takes effect at once even where the copy
//! here is up to a second old; while the copy says paused, every wake reads
//! the settings again, so a resume's NOTIFY starts claims at once.
//!
//! Each plain claim reads the claimable index from where the producer's
//! last claim ended, before it reads below (see `claim_floor`): beside a
//! snapshot held open for minutes, claims do not step over every task
//! claimed since it began.
//!
//! A claim whose answer never arrived (connection lost, deadline missed)
//! may still have committed: before claiming again, the producer releases
//! whatever that claim's token took, so a transient error never leaves a
//! task PROCESSING until the heartbeat timeout (which would count an
//! attempt).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Shared;
use super::claim_ahead::{self, Buffered, Dispatcher, Sizer};
use super::claim_floor::{Claim, ClaimFloor};
use super::executor::Done;
use super::hand_on::Lane;
use super::outage::Outage;
use super::wake::QueueWaker;
use crate::db::claim_fronts::WalkedFront;
use crate::db::{self, ClaimPosition, session::call};
use crate::records::QueueSettings;

/// How old the copy of the queue's settings may be when claiming.
const SETTINGS_MAX_AGE: Duration = Duration::from_secs(1);

/// How soon a claim cut short by a global concurrency limit looks again.
const LIMIT_RETRY: Duration = Duration::from_millis(25);

/// The claiming loop of one queue.
pub(crate) struct Producer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) queue: String,
    /// The queue's concurrency: how many of its handlers run at once.
    pub(crate) concurrency: usize,
    pub(crate) waker: Arc<QueueWaker>,
    pub(crate) stop: CancellationToken,
    pub(crate) tracker: TaskTracker,
    pub(crate) done: mpsc::Sender<Done>,
    /// What it shares with the completer's hand-ons: the capacity (places
    /// for running and buffered tasks: the concurrency, plus the places the
    /// claim-ahead buffer adds), the executor slots, and the dispatcher's
    /// buffer.
    pub(crate) lane: Lane,
}

/// A queue's capacity, executor slots and dispatcher buffer, made before
/// its producer so that the completer can share them.
pub(crate) fn lane(concurrency: usize) -> (Lane, mpsc::UnboundedReceiver<Buffered>) {
    let (to_dispatch, buffer) = mpsc::unbounded_channel();
    let lane = Lane {
        capacity: Arc::new(Semaphore::new(concurrency)),
        to_dispatch,
        slots: Arc::new(Semaphore::new(concurrency)),
    };
    (lane, buffer)
}

/// Runs the queue's producer and its dispatcher, which reads `buffer`.
pub(crate) async fn run(p: Producer, buffer: mpsc::UnboundedReceiver<Buffered>) {
    let slots = Arc::clone(&p.lane.slots);
    let started = Arc::new(AtomicU64::new(0));
    // The queue's runs waiting for an outcome: counted by its tasks'
    // places (the dispatcher gives each its count), read by the claims.
    let waiting_runs = Arc::new(AtomicUsize::new(0));
    let to_dispatch = p.lane.to_dispatch.clone();
    let dispatcher = tokio::spawn(claim_ahead::dispatch(Dispatcher {
        shared: Arc::clone(&p.shared),
        slots,
        buffer,
        started: Arc::clone(&started),
        waiting_runs: Arc::clone(&waiting_runs),
        tracker: p.tracker.clone(),
        done: p.done.clone(),
        stop: p.stop.clone(),
    }));
    claim_loop(p, &started, &waiting_runs, to_dispatch).await;
    // The dispatcher gives back what it still buffers once it sees the
    // stop; it is part of this producer's shutdown.
    let _ = dispatcher.await;
}

async fn claim_loop(
    p: Producer,
    started: &AtomicU64,
    waiting_runs: &AtomicUsize,
    to_dispatch: mpsc::UnboundedSender<Buffered>,
) {
    let Producer {
        shared,
        queue,
        concurrency,
        waker,
        stop,
        tracker: _,
        done: _,
        lane: Lane { capacity, .. },
    } = p;
    // `ahead` places beyond the concurrency follow the sizer's target.
    let mut ahead = 0;
    let mut sizer = Sizer::new(shared.config.claim_ahead, shared.config.claim_ahead_window);
    let mut outage = Outage::new("producer");
    let mut settings: Option<(QueueSettings, Instant)> = None;
    let mut floor = ClaimFloor::seeded(last_walk(&shared, &queue).await, Instant::now());
    loop {
        // Wait for at least one free place, then take every free one (up to
        // the batch cap): the claim is sized to what can run now, plus what
        // the buffer may hold.
        let first = tokio::select! {
            permit = Arc::clone(&capacity).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return,
            },
            () = stop.cancelled() => return,
        };
        let mut permits = gather_slots(
            &capacity,
            first,
            (concurrency + ahead).min(shared.config.max_claim_batch),
        )
        .await;
        if let Err(error) = release_lost_claims(&shared).await {
            let backoff = outage.failed(&error);
            drop(permits);
            tokio::select! {
                () = tokio::time::sleep(backoff) => continue,
                () = stop.cancelled() => return,
            }
        }
        if settings
            .as_ref()
            .is_none_or(|(_, read)| read.elapsed() >= SETTINGS_MAX_AGE)
        {
            let read = call(
                &shared.engine,
                shared.deadline,
                "queue settings",
                async |conn| db::queues::serve_queue(conn, &queue).await,
            )
            .await;
            match read {
                Ok(s) => settings = Some((s, Instant::now())),
                Err(error) => {
                    let backoff = outage.failed(&error);
                    drop(permits);
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => continue,
                        () = stop.cancelled() => return,
                    }
                }
            }
        }
        let Some((current, _)) = &settings else {
            continue;
        };
        if current.paused_at.is_some() {
            drop(permits);
            // Read the settings afresh at the next wake: the NOTIFY a
            // resume sends must find the queue resumed, not this copy
            // (which would hold the queue back for up to a second).
            settings = None;
            tokio::select! {
                () = waker.wait(shared.config.poll_interval.min(SETTINGS_MAX_AGE)) => continue,
                () = stop.cancelled() => return,
            }
        }
        let limited = current.is_limited();
        let rate = current.rate_per_second;
        // A queue with limits gets no buffer: its limits count claimed
        // tasks, and a buffered one would hold a place another worker could
        // run now. Nor does a queue whose keys run several tasks at once: a
        // buffered task holds one of its key's places without running, and
        // a later task of its key, handed the other, would start before it
        // elsewhere (or be claimed before it, once it is given back at
        // shutdown).
        let target = if limited || current.per_key_concurrency > 1 {
            0
        } else {
            sizer.target(
                started.load(Ordering::Relaxed),
                waiting_runs.load(Ordering::Relaxed),
                Instant::now(),
            )
        };
        claim_ahead::resize(&capacity, &mut ahead, target, &mut permits);
        let wanted = permits.len();
        if wanted == 0 {
            continue;
        }
        let token = shared.holdings.begin_claim();
        let now = shared.config.clock.now();
        let start = floor.start(Instant::now());
        let intake_above = Some(shared.intake.above(Instant::now()));
        let claimed = call(&shared.engine, shared.deadline, "claim", async |conn| {
            // The statement's own time, not the wait for a connection: it
            // is what tells a walk of a bloated index.
            let claim_started = Instant::now();
            if limited {
                let (tasks, held_back, intake_to) =
                    db::queues::claim_limited(conn, &queue, wanted, &token, now, intake_above)
                        .await?;
                shared.intake.moved(intake_to);
                Ok((tasks, held_back, None))
            } else {
                let claimed = db::claim_tasks(
                    conn,
                    &queue,
                    wanted,
                    &token,
                    now,
                    start,
                    shared.config.key_run,
                    intake_above,
                )
                .await?;
                shared.intake.moved(claimed.intake_to);
                let claim = Claim {
                    wanted,
                    got: claimed.tasks.len(),
                    first: claimed.first,
                    last: claimed.last,
                    took: claim_started.elapsed(),
                };
                Ok((claimed.tasks, false, Some(claim)))
            }
        })
        .await;
        let (got, held_back) = match claimed {
            Ok((tasks, held_back, claim)) => {
                outage.ok();
                match claim {
                    Some(claim) => {
                        let now = Instant::now();
                        if let Some(front) = floor.claimed(start, claim, now) {
                            tell_walk(&shared, &queue, front, claim.took, now);
                        }
                    }
                    // A limited queue is claimed from the front, without a
                    // floor.
                    None => floor.forget(),
                }
                shared.holdings.settle(&token, &tasks);
                shared
                    .counters
                    .claimed(tasks.iter().map(|t| 1 + t.run.len()).sum());
                let got = tasks.len();
                for task in tasks {
                    let Some(capacity) = permits.pop() else { break };
                    // Only fails when the dispatcher stopped (shutdown): the
                    // task stays held and is released with the rest.
                    let _ = to_dispatch.send(Buffered { task, capacity });
                }
                (got, held_back)
            }
            Err(error) => {
                shared.holdings.claim_failed(&token, &error);
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
        if held_back {
            // Cut short by the queue's limits: look again when the rate has
            // a token again, or soon for a global limit (the tasks that free
            // it may run on other workers, which do not say when they
            // finish).
            let wait = rate
                .filter(|r| r.is_finite() && *r > 0.0)
                .map_or(LIMIT_RETRY, |r| {
                    Duration::from_secs_f64((1.0 / r).clamp(0.001, 3600.0))
                })
                .max(Duration::from_millis(1))
                .min(shared.config.poll_interval);
            tokio::select! {
                () = waker.wait(wait) => {}
                () = stop.cancelled() => return,
            }
            continue;
        }
        // Found some: more may be committing right now, possibly without a
        // NOTIFY of their own (see `wakeup`), so look again soon.
        let wait = if got > 0 {
            shared
                .config
                .busy_poll_interval
                .min(shared.config.poll_interval)
        } else {
            shared.config.poll_interval
        };
        // While claims read below the floor only from the front, a task
        // before it waits for the next walk: be back for that walk.
        let wait = floor
            .walk_due_in(Instant::now())
            .map_or(wait, |due| wait.min(due.max(Duration::from_millis(1))));
        tokio::select! {
            () = waker.wait(wait) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// The last slow walk of `queue`'s claimable index by any producer
/// (migration 35), for this producer's first floor. A hint: when it cannot
/// be read, the first claim walks.
async fn last_walk(shared: &Shared, queue: &str) -> Option<WalkedFront> {
    let read = call(
        &shared.engine,
        shared.deadline,
        "claim front",
        async |conn| db::claim_fronts::read(conn, queue).await,
    )
    .await;
    read.unwrap_or_else(|error| {
        tracing::debug!(%error, queue, "could not read the queue's last walk; the first claim walks");
        None
    })
}

/// Records, in a task of its own so that no claim waits for it, that a slow
/// walk of `queue`'s claimable index (it took `took` and ended at `ended`)
/// found its first task at `front`: the queue's producers that start later
/// begin there (migration 35). Lost when it fails: they walk instead.
fn tell_walk(
    shared: &Arc<Shared>,
    queue: &str,
    front: ClaimPosition,
    took: Duration,
    ended: Instant,
) {
    let shared = Arc::clone(shared);
    let queue = queue.to_owned();
    tokio::spawn(async move {
        let written = call(
            &shared.engine,
            shared.deadline,
            "claim front",
            // When the walk ended, not when a session was free to say so.
            async |conn| db::claim_fronts::write(conn, &queue, front, took, ended.elapsed()).await,
        )
        .await;
        if let Err(error) = written {
            tracing::debug!(%error, queue, "could not record where the walk of the queue's index began");
        }
    });
}

/// Releases the tasks of claims whose answer never arrived, if any.
async fn release_lost_claims(shared: &Shared) -> sqlx::Result<()> {
    let tokens = shared.holdings.lost_claims();
    if tokens.is_empty() {
        return Ok(());
    }
    let released = call(&shared.engine, shared.deadline, "release", async |conn| {
        db::release_claims(conn, &tokens).await
    })
    .await?;
    shared.holdings.forget_claims(&tokens);
    if !released.is_empty() {
        tracing::info!(
            ?released,
            "released tasks of a claim whose answer was lost with its connection"
        );
    }
    Ok(())
}

/// Takes every free slot, up to `max`. When fewer than half are free (the
/// worker is busy and slots are coming back one by one), waits up to a
/// millisecond for more, so that one claim carries many tasks instead of
/// many claims carrying one each.
async fn gather_slots(
    slots: &Arc<Semaphore>,
    first: OwnedSemaphorePermit,
    max: usize,
) -> Vec<OwnedSemaphorePermit> {
    let mut permits = vec![first];
    let take_free = |permits: &mut Vec<OwnedSemaphorePermit>| {
        while permits.len() < max {
            match Arc::clone(slots).try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
    };
    take_free(&mut permits);
    let enough = max.div_ceil(2);
    let deadline = tokio::time::Instant::now() + COALESCE_WAIT;
    while permits.len() < enough {
        tokio::select! {
            permit = Arc::clone(slots).acquire_owned() => match permit {
                Ok(p) => permits.push(p),
                Err(_) => break,
            },
            () = tokio::time::sleep_until(deadline) => break,
        }
        take_free(&mut permits);
    }
    permits
}

/// How long a busy producer waits for more free slots before it claims.
const COALESCE_WAIT: Duration = Duration::from_millis(1);
