//! The worker: a producer per queue claims tasks (TX1), an executor runs
//! handlers with no transaction held, and a completer writes outcomes in
//! batches (TX2).
//!
//! ```no_run
//! # use serde::{Deserialize, Serialize};
//! # use outbox::{HandlerResult, Outcome, TaskContext, TaskHandler, Worker};
//! # #[derive(Serialize, Deserialize)]
//! # #[outbox::outbox_task(task_type = "email.welcome")]
//! # struct SendWelcome { user_id: i64 }
//! struct Mailer;
//! impl TaskHandler<SendWelcome> for Mailer {
//!     async fn handle(&self, _ctx: TaskContext, task: SendWelcome) -> HandlerResult {
//!         println!("welcome, user {}", task.user_id);
//!         Ok(Outcome::Success)
//!     }
//! }
//! # async fn f(pool: sqlx::PgPool) -> outbox::Result<()> {
//! let worker = Worker::builder(pool).handler::<SendWelcome>(Mailer).build()?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! worker.run(shutdown).await?;
//! # Ok(()) }
//! ```

mod claim_ahead;
mod claim_floor;
mod completer;
mod config;
mod counters;
mod deferred_keys;
mod events;
mod executor;
mod hand_on;
mod heartbeat;
mod holdings;
mod leader_settings;
mod listener;
mod maintainer;
mod tick_wake;
pub(crate) use maintainer::lease_ttl;
pub(crate) mod outage;
mod presence;
mod producer;
pub(crate) mod registry;
mod runs;
mod schema_gate;
mod shutdown;
mod table_watch;
mod throughput;
mod vacuumer;
mod wake;

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::periodic::PeriodicTask;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::WorkerConfig;
pub use counters::{CountersSnapshot, WorkerCounters};
pub use events::{TaskEvent, TaskEventKind};
pub use maintainer::MAINTENANCE_LEASE;

use crate::clock::Clock;
use crate::db::session::{EnginePool, SessionLimits};
use crate::error::{Error, Result, StartupProblems};
use crate::handler::{TaskHandler, TypedHandler};
use crate::task::{Task, registered_tasks};
use registry::{HandlerEntry, Handlers};

/// Concurrency of a queue that was not given one.
pub const DEFAULT_CONCURRENCY: usize = 10;

/// The highest concurrency a queue may have.
pub const MAX_CONCURRENCY: usize = 100_000;

/// Builds a [`Worker`]: handlers, queues and settings, checked at
/// [`WorkerBuilder::build`].
pub struct WorkerBuilder {
    pool: PgPool,
    handlers: Handlers,
    queues: Vec<(String, usize)>,
    config: WorkerConfig,
    periodic: Vec<PeriodicTask>,
    relays: Vec<crate::relay::Relay>,
}

impl WorkerBuilder {
    /// The pool the worker was built on: the one handlers reach through
    /// [`TaskContext::pool`](crate::TaskContext::pool), here for handlers
    /// that keep a pool of their own (a binary built with
    /// `outbox_worker::main_with` gets the pool the operator's
    /// `--database-url` opened).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Registers the handler for task type `T`.
    pub fn handler<T: Task>(mut self, handler: impl TaskHandler<T>) -> Self {
        self.handlers.insert(
            T::TASK_TYPE,
            HandlerEntry {
                handler: Arc::new(TypedHandler::<T, _>::new(handler)),
                retry_delays: T::RETRY_DELAYS,
                timeout: T::TIMEOUT,
                queue: T::QUEUE,
                rust_type: std::any::type_name::<T>(),
            },
        );
        self
    }

    /// Serves `queue` with at most `concurrency` tasks at once. Without any
    /// call, the worker serves the default queues of its handlers' types.
    pub fn queue(mut self, queue: impl Into<String>, concurrency: usize) -> Self {
        let queue = queue.into();
        self.queues.retain(|(q, _)| *q != queue);
        self.queues.push((queue, concurrency));
        self
    }

    /// Replaces the whole configuration, including what earlier calls of
    /// [`WorkerBuilder::poll_interval`] or [`WorkerBuilder::clock`] set: call
    /// it first.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the fallback poll interval.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// Declares a periodic task: the cluster's maintenance leader enqueues
    /// it once per tick of its schedule (see [`crate::periodic`]). Every
    /// worker of a cluster should declare the same periodic tasks; the
    /// leader's declarations are the ones recorded.
    pub fn periodic(mut self, task: PeriodicTask) -> Self {
        self.periodic.retain(|p| p.name != task.name);
        self.periodic.push(task);
        self
    }

    /// Runs a relay: this worker publishes the event log through the
    /// relay's sink, as (a member of) the relay's subscription (see
    /// [`crate::relay`]). Any number of relays, each with its own name.
    pub fn relay(mut self, relay: crate::relay::Relay) -> Self {
        self.relays.push(relay);
        self
    }

    /// Sets the clock (tests).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.config.clock = clock;
        self
    }

    /// Checks everything and returns the worker, or every problem found.
    pub fn build(mut self) -> Result<Worker> {
        let queues = if self.queues.is_empty() {
            self.handlers
                .default_queues()
                .into_iter()
                .map(|q| (q.to_owned(), DEFAULT_CONCURRENCY))
                .collect()
        } else {
            std::mem::take(&mut self.queues)
        };
        let mut problems = Vec::new();
        let mut seen_names = std::collections::BTreeSet::new();
        for r in &self.relays {
            problems.extend(r.problems());
            problems.extend(r.route_problem());
            if !seen_names.insert(r.name.clone()) {
                problems.push(format!("two relays are named {:?}", r.name));
            }
        }
        let relays: Vec<(String, String)> = self
            .relays
            .iter()
            .map(|r| (r.name.clone(), r.queue.clone()))
            .collect();
        problems.extend(self.handlers.problems(
            &registered_tasks(),
            &queues,
            !self.relays.is_empty(),
        ));
        // One switch for both: a pool marked as pooled makes a pooled
        // worker, and a pooled worker's handlers get a marked pool.
        if crate::pooler::is_marked(&self.pool) {
            self.config.pooler = true;
        } else if self.config.pooler {
            crate::pooler::mark(&self.pool);
        }
        problems.extend(config::config_problems(&self.config, &queues));
        if !self.config.maintenance && !self.periodic.is_empty() {
            // Only the maintenance leader enqueues ticks, and this worker
            // never leads: its declarations would never take effect.
            problems.push(format!(
                "periodic tasks ({}) are declared on a worker without maintenance: only the \
                 maintenance leader enqueues their ticks; declare them on workers that take part \
                 in maintenance",
                self.periodic
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !problems.is_empty() {
            return Err(Error::Startup(StartupProblems(problems)));
        }
        // Not an error (tasks can be submitted to any queue), but most often
        // a misspelling: say so instead of idling in silence.
        let known = self.handlers.default_queues();
        for (queue, _) in &queues {
            if !known.contains(queue.as_str()) {
                tracing::warn!(
                    queue = %queue,
                    known = ?known,
                    "no task type this worker handles has this queue as its default: \
                     only tasks submitted to it explicitly will run here (a misspelling?)"
                );
            }
        }
        let (events, _) = broadcast::channel(4096);
        Ok(Worker {
            pool: self.pool,
            handlers: Arc::new(self.handlers),
            queues,
            config: self.config,
            events,
            counters: Arc::default(),
            periodic: Arc::new(self.periodic),
            relays,
            relay_runs: self.relays,
        })
    }
}

/// A configured worker, ready to run.
pub struct Worker {
    pub(crate) pool: PgPool,
    handlers: Arc<Handlers>,
    queues: Vec<(String, usize)>,
    config: WorkerConfig,
    events: broadcast::Sender<TaskEvent>,
    counters: Arc<WorkerCounters>,
    periodic: Arc<Vec<PeriodicTask>>,
    /// The relays' names and streams.
    relays: Vec<(String, String)>,
    relay_runs: Vec<crate::relay::Relay>,
}

/// What the producers, executor and completer share.
pub(crate) struct Shared {
    /// The application's pool, handed to handlers.
    pub(crate) pool: PgPool,
    /// The worker's own sessions, with server-side limits.
    pub(crate) engine: EnginePool,
    /// How long the worker waits for one database call.
    pub(crate) deadline: Duration,
    pub(crate) handlers: Arc<Handlers>,
    pub(crate) config: WorkerConfig,
    /// Cancelled when the grace period is over; handlers see it.
    pub(crate) handler_cancel: CancellationToken,
    pub(crate) holdings: holdings::Holdings,
    pub(crate) counters: Arc<WorkerCounters>,
    /// What wakes each queue's producer.
    pub(crate) wakers: wake::Wakers,
    /// Outcome counts per minute not yet written.
    pub(crate) throughput: throughput::Throughput,
    /// Periodic tasks the maintenance leader enqueues.
    pub(crate) periodic: Arc<Vec<PeriodicTask>>,
    /// Where the completer puts the tasks it hands ordering keys on to.
    pub(crate) hand_on: hand_on::HandOn,
    /// Where claims read the intake from.
    pub(crate) intake: crate::db::intake::IntakeFloor,
}

impl Worker {
    /// Starts building a worker on `pool`.
    pub fn builder(pool: PgPool) -> WorkerBuilder {
        WorkerBuilder {
            pool,
            handlers: Handlers::default(),
            queues: Vec::new(),
            config: WorkerConfig::default(),
            periodic: Vec::new(),
            relays: Vec::new(),
        }
    }

    /// The relays this worker runs, as (name, stream).
    pub fn relays(&self) -> &[(String, String)] {
        &self.relays
    }

    /// The queues this worker serves, with their concurrency.
    pub fn queues(&self) -> &[(String, usize)] {
        &self.queues
    }

    /// This worker's counters of statements and tasks (live while it runs).
    pub fn counters(&self) -> Arc<WorkerCounters> {
        Arc::clone(&self.counters)
    }

    /// Subscribes to the outcomes this worker commits (each is reported only
    /// after its TX2 committed). Subscribe before [`Worker::run`].
    pub fn subscribe(&self) -> broadcast::Receiver<TaskEvent> {
        self.events.subscribe()
    }

    /// Runs until `shutdown` is cancelled, then stops claiming, lets
    /// in-flight tasks finish within the grace period, cancels and releases
    /// the rest, and writes every outcome it can.
    ///
    /// Shutdown is bounded whether the database is up, down or silent: it
    /// takes at most `shutdown_grace + 2 × cancel_grace + flush_timeout`
    /// (plus a moment to hand the maintenance lease over), unless a handler
    /// ignores cancellation and never yields.
    ///
    /// On a schema behind this build (see [`crate::schema_status`]) the
    /// worker registers and heartbeats but claims, relays and maintains
    /// nothing until the schema is migrated: it looks again every second.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let limits = SessionLimits {
            statement_timeout: self.config.statement_timeout,
            keepalive: self.config.keepalive,
            pooled: self.config.pooler,
        };
        // A claim in flight per queue, the outcome lanes, the keys they
        // owe a hand-over, the heartbeat, the maintainer and its vacuum, the
        // throughput counts, the worker's row, and one to spare for
        // releases.
        let sessions = self.queues.len() + self.config.finish_lanes.max(1) + 7;
        let engine = EnginePool::new(&self.pool, &self.config.worker_id, limits, sessions);
        // Behind a pooler only a direct connection hears notifications.
        let listen_options = match (&self.config.listen_options, self.config.pooler) {
            (Some(direct), _) => Some(limits.direct().apply(direct, &self.config.worker_id)),
            (None, false) => Some(engine.options().clone()),
            (None, true) => None,
        };
        if self.config.pooler {
            tracing::info!(
                listen = listen_options.is_some(),
                poll_interval = ?self.config.poll_interval,
                "sessions go through a pooler in transaction mode{}",
                if listen_options.is_some() || !self.config.listen {
                    ""
                } else {
                    ": no direct connection to LISTEN on, so queues are polled"
                }
            );
        }
        let wakers = wake::for_queues(self.queues.iter().map(|(q, _)| q));
        let stop_claiming = shutdown.child_token();
        // Each queue's lane is shared by its producer and the completer's
        // hand-ons; the dispatcher's buffer goes to the producer alone.
        let mut lanes = std::collections::HashMap::new();
        let mut producer_ends = Vec::new();
        for (queue, concurrency) in &self.queues {
            let (lane, buffer) = producer::lane(*concurrency);
            producer_ends.push((lane.clone(), buffer));
            lanes.insert(queue.clone(), lane);
        }
        let shared = Arc::new(Shared {
            hand_on: hand_on::HandOn::new(lanes, stop_claiming.clone(), self.config.key_run),
            intake: crate::db::intake::IntakeFloor::default(),
            wakers: Arc::clone(&wakers),
            throughput: throughput::Throughput::default(),
            periodic: Arc::clone(&self.periodic),
            pool: self.pool.clone(),
            engine,
            deadline: limits.deadline(),
            handlers: self.handlers,
            holdings: holdings::Holdings::new(&self.config.worker_id),
            config: self.config,
            handler_cancel: CancellationToken::new(),
            counters: Arc::clone(&self.counters),
        });
        // run_id: the id `workers list` shows, and the start of every claim
        // token this run writes (claimed_by).
        tracing::info!(
            worker_id = %shared.config.worker_id,
            run_id = %shared.holdings.run_id(),
            queues = ?self.queues,
            "worker starting"
        );
        let (done_tx, done_rx) = mpsc::channel(shared.config.max_finish_batch.max(1) * 4);
        let give_up = CancellationToken::new();
        let mut completer = tokio::spawn(completer::run(
            Arc::clone(&shared),
            done_rx,
            self.events,
            give_up.clone(),
        ));

        let listen_options = listen_options.filter(|_| shared.config.listen);
        let listener = listen_options.map(|listen_options| {
            let held = Arc::clone(&shared);
            let on_cancel: listener::OnCancel = Arc::new(move |id| {
                if held.holdings.request_cancel(id) {
                    tracing::info!(task_id = id, "cancel requested by an operator");
                }
            });
            tokio::spawn(listener::run(
                listen_options,
                shared.deadline,
                shared.config.keepalive / 2,
                Arc::clone(&wakers),
                on_cancel,
                stop_claiming.clone(),
            ))
        });
        let stop_background = CancellationToken::new();
        let presence = tokio::spawn(presence::run(
            Arc::clone(&shared),
            presence::identity(&shared, &self.queues),
            stop_background.clone(),
        ));
        let heartbeat = tokio::spawn(heartbeat::run(Arc::clone(&shared), stop_background.clone()));
        let throughput = tokio::spawn(throughput::run(
            Arc::clone(&shared),
            stop_background.clone(),
        ));
        // Claims, relays and maintenance run this build's statements, which
        // an older schema lacks: they start once it has caught up (none if
        // the worker is stopped first).
        let ready = schema_gate::wait(&shared, &stop_claiming).await;
        let maintainer = (ready && shared.config.maintenance)
            .then(|| tokio::spawn(maintainer::run(Arc::clone(&shared), stop_claiming.clone())));
        // Relays stop reading batches with the claims, and stop publishing
        // when the grace is over.
        let abandon_relays = CancellationToken::new();
        let relays: Vec<_> = self
            .relay_runs
            .into_iter()
            .filter(|_| ready)
            .map(|relay| {
                tokio::spawn(crate::relay::run(
                    relay,
                    shared.pool.clone(),
                    shared.config.worker_id.clone(),
                    limits,
                    stop_claiming.clone(),
                    abandon_relays.clone(),
                ))
            })
            .collect();
        let tracker = TaskTracker::new();
        let mut producers = Vec::new();
        let queues = self.queues.iter().zip(producer_ends).filter(|_| ready);
        for ((queue, concurrency), (lane, buffer)) in queues {
            let producer = producer::Producer {
                shared: Arc::clone(&shared),
                queue: queue.clone(),
                concurrency: *concurrency,
                waker: Arc::clone(&wakers[queue]),
                stop: stop_claiming.clone(),
                tracker: tracker.clone(),
                done: done_tx.clone(),
                lane,
            };
            producers.push(tokio::spawn(producer::run(producer, buffer)));
        }
        drop(done_tx);

        shutdown.cancelled().await;
        let grace_over = Instant::now() + shared.config.shutdown_grace;
        tracing::info!(
            in_flight = shared.holdings.len(),
            "shutdown requested: no new claims; waiting for in-flight tasks"
        );
        // A producer in the middle of a claim finishes it within the grace
        // period or is dropped; its claim token stays recorded and is
        // released below.
        for mut producer in producers {
            if tokio::time::timeout_at(grace_over, &mut producer)
                .await
                .is_err()
            {
                producer.abort();
            }
        }
        tracker.close();
        shutdown::finish_handlers(&shared, &tracker, grace_over).await;
        for mut relay in relays {
            if tokio::time::timeout_at(grace_over, &mut relay)
                .await
                .is_err()
            {
                abandon_relays.cancel();
                let _ = relay.await;
            }
        }

        // Outcomes still queued or being retried get until the flush
        // deadline; then whatever this worker still holds is released.
        let flush_over = Instant::now() + shared.config.flush_timeout;
        if tokio::time::timeout_at(flush_over, &mut completer)
            .await
            .is_err()
        {
            give_up.cancel();
            let _ = completer.await;
        }
        shutdown::release_remaining(&shared, flush_over).await;
        stop_background.cancel();
        let _ = heartbeat.await;
        let _ = throughput.await;
        let _ = presence.await;
        throughput::last_flush(&shared, flush_over).await;
        // Both stopped with the claims; the maintainer may still be handing
        // its lease over (bounded by its own deadline).
        for task in listener.into_iter().chain(maintainer) {
            let _ = task.await;
        }
        shared.engine.close(Duration::from_millis(200)).await;
        tracing::info!("worker stopped");
        Ok(())
    }
}
