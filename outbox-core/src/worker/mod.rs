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

mod completer;
mod counters;
mod events;
mod executor;
mod heartbeat;
mod listener;
mod maintainer;
mod outage;
mod producer;
pub(crate) mod registry;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore, broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use counters::{CountersSnapshot, WorkerCounters};
pub use events::{TaskEvent, TaskEventKind};
pub use maintainer::MAINTENANCE_APPLICATION_NAME;

use crate::clock::Clock;
use crate::error::{Error, Result, StartupProblems};
use crate::handler::{TaskHandler, TypedHandler};
use crate::task::{Task, registered_tasks};
use registry::{HandlerEntry, Handlers};

/// Concurrency of a queue that was not given one.
pub const DEFAULT_CONCURRENCY: usize = 10;

/// How a worker behaves; every field has a sensible default.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// How often an idle queue looks for due tasks even without a NOTIFY.
    /// NOTIFY is an optimisation; this poll is the guarantee.
    pub poll_interval: Duration,
    /// After a claim that found work but did not fill every free slot, how
    /// soon the queue looks again (capped by `poll_interval`). Catches tasks
    /// whose NOTIFY was folded into an earlier one.
    pub busy_poll_interval: Duration,
    /// The most tasks one claim takes (claims are also capped by free slots).
    pub max_claim_batch: usize,
    /// The most outcomes one TX2 writes.
    pub max_finish_batch: usize,
    /// How many TX2 statements may be in flight at once.
    pub finish_lanes: usize,
    /// How long in-flight tasks may run on after shutdown is requested
    /// before they are cancelled and put back for another worker.
    pub shutdown_grace: Duration,
    /// After the grace period the handlers' cancellation token fires; this
    /// is how long they get to return before they are aborted and released.
    pub cancel_grace: Duration,
    /// How often the worker bumps heartbeat_at of its in-flight tasks.
    pub heartbeat_interval: Duration,
    /// A PROCESSING task whose heartbeat is older than this is presumed
    /// lost and made claimable again (counting an attempt). Keep it several
    /// heartbeat intervals long.
    pub heartbeat_timeout: Duration,
    /// Whether this worker takes part in maintenance (recovery, cleanup).
    /// One worker of the cluster leads at a time.
    pub maintenance: bool,
    /// How often the maintenance leader runs recovery, and how often the
    /// other workers try to take over the role.
    pub maintenance_interval: Duration,
    /// How long COMPLETED tasks are kept before cleanup deletes them.
    pub retention: Duration,
    /// Delete successful tasks at once instead of keeping them as COMPLETED
    /// history (a retention of zero). Cheaper for the database; FAILED and
    /// dead rows are kept either way.
    pub delete_completed: bool,
    /// How often the leader runs cleanup.
    pub cleanup_interval: Duration,
    /// Whether to LISTEN for submit notifications.
    pub listen: bool,
    /// The clock for time-dependent statements.
    pub clock: Clock,
    /// This worker's name on the rows it claims.
    pub worker_id: String,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            busy_poll_interval: Duration::from_millis(5),
            max_claim_batch: 100,
            max_finish_batch: 1000,
            finish_lanes: 2,
            shutdown_grace: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(1),
            heartbeat_interval: Duration::from_secs(10),
            heartbeat_timeout: Duration::from_secs(5 * 60),
            maintenance: true,
            maintenance_interval: Duration::from_secs(5),
            retention: Duration::from_secs(7 * 24 * 3600),
            delete_completed: false,
            cleanup_interval: Duration::from_secs(60),
            listen: true,
            clock: Clock::database(),
            worker_id: default_worker_id(),
        }
    }
}

/// Builds a [`Worker`]: handlers, queues and settings, checked at
/// [`WorkerBuilder::build`].
pub struct WorkerBuilder {
    pool: PgPool,
    handlers: Handlers,
    queues: Vec<(String, usize)>,
    config: WorkerConfig,
}

impl WorkerBuilder {
    /// Registers the handler for task type `T`.
    pub fn handler<T: Task>(mut self, handler: impl TaskHandler<T>) -> Self {
        self.handlers.insert(
            T::TASK_TYPE,
            HandlerEntry {
                handler: Arc::new(TypedHandler::<T, _>::new(handler)),
                retry_delays: T::RETRY_DELAYS,
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

    /// Replaces the whole configuration.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the fallback poll interval.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// Sets the clock (tests).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.config.clock = clock;
        self
    }

    /// Checks everything and returns the worker, or every problem found.
    pub fn build(self) -> Result<Worker> {
        let queues = if self.queues.is_empty() {
            self.handlers
                .default_queues()
                .into_iter()
                .map(|q| (q.to_owned(), DEFAULT_CONCURRENCY))
                .collect()
        } else {
            self.queues
        };
        let problems = self.handlers.problems(&registered_tasks(), &queues);
        if !problems.is_empty() {
            return Err(Error::Startup(StartupProblems(problems)));
        }
        let (events, _) = broadcast::channel(4096);
        Ok(Worker {
            pool: self.pool,
            handlers: Arc::new(self.handlers),
            queues,
            config: self.config,
            events,
            counters: Arc::default(),
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
}

/// What the producers, executor and completer share.
pub(crate) struct Shared {
    pub(crate) pool: PgPool,
    pub(crate) handlers: Arc<Handlers>,
    pub(crate) config: WorkerConfig,
    /// Cancelled when the grace period is over; handlers see it.
    pub(crate) handler_cancel: CancellationToken,
    pub(crate) in_flight: executor::InFlight,
    pub(crate) counters: Arc<WorkerCounters>,
}

impl Worker {
    /// Starts building a worker on `pool`.
    pub fn builder(pool: PgPool) -> WorkerBuilder {
        WorkerBuilder {
            pool,
            handlers: Handlers::default(),
            queues: Vec::new(),
            config: WorkerConfig::default(),
        }
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
    /// the rest, and writes every outcome it has.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let shared = Arc::new(Shared {
            pool: self.pool.clone(),
            handlers: self.handlers,
            config: self.config,
            handler_cancel: CancellationToken::new(),
            in_flight: executor::InFlight::default(),
            counters: Arc::clone(&self.counters),
        });
        tracing::info!(
            worker_id = %shared.config.worker_id,
            queues = ?self.queues,
            "worker starting"
        );
        let (done_tx, done_rx) = mpsc::channel(shared.config.max_finish_batch.max(1) * 4);
        let completer = tokio::spawn(completer::run(Arc::clone(&shared), done_rx, self.events));

        let wakers: Arc<HashMap<String, Arc<Notify>>> = Arc::new(
            self.queues
                .iter()
                .map(|(q, _)| (q.clone(), Arc::new(Notify::new())))
                .collect(),
        );
        let stop_claiming = shutdown.child_token();
        let listener = shared.config.listen.then(|| {
            tokio::spawn(listener::run(
                self.pool.clone(),
                Arc::clone(&wakers),
                stop_claiming.clone(),
            ))
        });
        let stop_background = CancellationToken::new();
        let heartbeat = tokio::spawn(heartbeat::run(Arc::clone(&shared), stop_background.clone()));
        let maintainer = shared
            .config
            .maintenance
            .then(|| tokio::spawn(maintainer::run(Arc::clone(&shared), stop_claiming.clone())));
        let tracker = TaskTracker::new();
        let mut producers = Vec::new();
        for (queue, concurrency) in &self.queues {
            producers.push(tokio::spawn(producer::run(producer::Producer {
                shared: Arc::clone(&shared),
                queue: queue.clone(),
                slots: Arc::new(Semaphore::new(*concurrency)),
                concurrency: *concurrency,
                waker: Arc::clone(&wakers[queue]),
                stop: stop_claiming.clone(),
                tracker: tracker.clone(),
                done: done_tx.clone(),
            })));
        }
        drop(done_tx);

        shutdown.cancelled().await;
        tracing::info!(
            in_flight = shared.in_flight.len(),
            "shutdown requested: no new claims; waiting for in-flight tasks"
        );
        for task in producers.into_iter().chain(listener).chain(maintainer) {
            let _ = task.await;
        }
        tracker.close();
        if tokio::time::timeout(shared.config.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = shared.in_flight.len(),
                "grace period over: cancelling in-flight tasks"
            );
            shared.handler_cancel.cancel();
            if tokio::time::timeout(shared.config.cancel_grace, tracker.wait())
                .await
                .is_err()
            {
                executor::release_unfinished(&shared).await;
                // An aborted handler stops at its next await; one that never
                // yields cannot be stopped, and must not keep us from exiting.
                if tokio::time::timeout(shared.config.cancel_grace, tracker.wait())
                    .await
                    .is_err()
                {
                    tracing::error!(
                        "a handler ignores cancellation and never yields; exiting without it"
                    );
                }
            }
        }
        stop_background.cancel();
        let _ = heartbeat.await;
        let _ = completer.await;
        tracing::info!("worker stopped");
        Ok(())
    }
}

/// `host:pid:random`, unique enough to tell workers apart on the rows.
fn default_worker_id() -> String {
    use std::hash::{BuildHasher, RandomState};
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    let random = RandomState::new().hash_one(std::time::SystemTime::now()) & 0xffff_ffff;
    format!("{}:{}:{random:08x}", host.trim(), std::process::id())
}
