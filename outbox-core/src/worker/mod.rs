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
mod holdings;
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
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use counters::{CountersSnapshot, WorkerCounters};
pub use events::{TaskEvent, TaskEventKind};
pub use maintainer::MAINTENANCE_LEASE;

use crate::clock::Clock;
use crate::db::classify::is_transient;
use crate::db::session::{EnginePool, SessionLimits, call};
use crate::error::{Error, Result, StartupProblems};
use crate::handler::{TaskHandler, TypedHandler};
use crate::task::{Task, registered_tasks};
use registry::{HandlerEntry, Handlers};

/// Concurrency of a queue that was not given one.
pub const DEFAULT_CONCURRENCY: usize = 10;

/// The highest concurrency a queue may have.
pub const MAX_CONCURRENCY: usize = 100_000;

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
    /// At shutdown, once handlers are done, how long outcomes still unwritten
    /// (the database may be down or silent) may take to be written and the
    /// worker's remaining tasks to be released. What is left after it is
    /// logged with its task ids; stuck-task recovery reruns those tasks.
    pub flush_timeout: Duration,
    /// Server-side `statement_timeout` of the worker's own statements
    /// (claims, outcomes, heartbeats, maintenance). The worker gives up on a
    /// call one second later and discards its connection, so a silent
    /// server or network is noticed within this plus a second.
    pub statement_timeout: Duration,
    /// How long a silent connection may last: the server drops a worker
    /// session whose client stopped answering within about this long (TCP
    /// keepalives and `tcp_user_timeout`), and the idle LISTEN connection is
    /// pinged after half of it.
    pub keepalive: Duration,
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
            flush_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(5),
            keepalive: Duration::from_secs(10),
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
        let mut problems = self.handlers.problems(&registered_tasks(), &queues);
        problems.extend(config_problems(&self.config, &queues));
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
    /// the rest, and writes every outcome it can.
    ///
    /// Shutdown is bounded whether the database is up, down or silent: it
    /// takes at most `shutdown_grace + 2 × cancel_grace + flush_timeout`
    /// (plus a moment to hand the maintenance lease over), unless a handler
    /// ignores cancellation and never yields.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let limits = SessionLimits {
            statement_timeout: self.config.statement_timeout,
            keepalive: self.config.keepalive,
        };
        // A claim in flight per queue, the outcome lanes, the heartbeat, the
        // maintainer, and one to spare for releases.
        let sessions = self.queues.len() + self.config.finish_lanes.max(1) + 3;
        let engine = EnginePool::new(&self.pool, &self.config.worker_id, limits, sessions);
        let listen_options = engine.options().clone();
        let shared = Arc::new(Shared {
            pool: self.pool.clone(),
            engine,
            deadline: limits.deadline(),
            handlers: self.handlers,
            holdings: holdings::Holdings::new(&self.config.worker_id),
            config: self.config,
            handler_cancel: CancellationToken::new(),
            counters: Arc::clone(&self.counters),
        });
        tracing::info!(
            worker_id = %shared.config.worker_id,
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

        let wakers: Arc<HashMap<String, Arc<Notify>>> = Arc::new(
            self.queues
                .iter()
                .map(|(q, _)| (q.clone(), Arc::new(Notify::new())))
                .collect(),
        );
        let stop_claiming = shutdown.child_token();
        let listener = shared.config.listen.then(|| {
            tokio::spawn(listener::run(
                listen_options,
                shared.deadline,
                shared.config.keepalive / 2,
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
        finish_handlers(&shared, &tracker, grace_over).await;

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
        release_remaining(&shared, flush_over).await;
        stop_background.cancel();
        let _ = heartbeat.await;
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

/// Waits for the handlers until `grace_over`; then fires their cancellation
/// token and, after `cancel_grace`, aborts those still running (their tasks
/// stay held and are released with the rest).
async fn finish_handlers(shared: &Shared, tracker: &TaskTracker, grace_over: Instant) {
    if tokio::time::timeout_at(grace_over, tracker.wait())
        .await
        .is_ok()
    {
        return;
    }
    tracing::warn!(
        in_flight = shared.holdings.len(),
        "grace period over: cancelling in-flight tasks"
    );
    shared.handler_cancel.cancel();
    let cancel_grace = shared.config.cancel_grace;
    if tokio::time::timeout(cancel_grace, tracker.wait())
        .await
        .is_ok()
    {
        return;
    }
    let aborted = shared.holdings.abort_running();
    tracing::warn!(
        aborted,
        "handlers still running after cancellation: aborted"
    );
    // An aborted handler stops at its next await; one that never yields
    // cannot be stopped, and must not keep us from exiting.
    if tokio::time::timeout(cancel_grace, tracker.wait())
        .await
        .is_err()
    {
        tracing::error!("a handler ignores cancellation and never yields; exiting without it");
    }
}

/// Puts every task this worker still holds back to PENDING without counting
/// an attempt (aborted handlers, abandoned claims, outcomes that could not
/// be written), trying until `deadline`. What cannot be released is logged
/// with its task ids; stuck-task recovery returns those after the timeout.
async fn release_remaining(shared: &Shared, deadline: Instant) {
    let tokens = shared.holdings.all_tokens();
    if tokens.is_empty() {
        return;
    }
    let held = shared.holdings.held_ids();
    let mut outage = outage::Outage::new("release");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tracing::error!(
                task_ids = ?held,
                "could not release unfinished tasks before exit (the flush deadline passed); \
                 stuck-task recovery will rerun them after the heartbeat timeout"
            );
            return;
        }
        let result = call(
            &shared.engine,
            left.min(shared.deadline),
            "release",
            async |conn| crate::db::release_claims(conn, &tokens).await,
        )
        .await;
        match result {
            Ok(released) => {
                tracing::info!(released = ?released, "released this worker's unfinished tasks");
                shared.holdings.clear();
                return;
            }
            Err(error) if is_transient(&error) && Instant::now() < deadline => {
                let backoff = outage.failed(&error);
                tokio::time::sleep_until((Instant::now() + backoff).min(deadline)).await;
            }
            Err(error) => {
                tracing::error!(
                    %error,
                    task_ids = ?held,
                    "could not release unfinished tasks before exit; stuck-task recovery will rerun them after the heartbeat timeout"
                );
                return;
            }
        }
    }
}

/// Settings that would break the worker: every problem, for the list
/// `build` refuses to start with.
fn config_problems(config: &WorkerConfig, queues: &[(String, usize)]) -> Vec<String> {
    let mut problems = Vec::new();
    // (A concurrency of zero is the registry's to report.)
    for (queue, concurrency) in queues {
        if *concurrency > MAX_CONCURRENCY {
            problems.push(format!(
                "queue {queue:?} has concurrency {concurrency}: use 1 to {MAX_CONCURRENCY}"
            ));
        }
    }
    let positive = [
        ("poll_interval", config.poll_interval),
        ("heartbeat_interval", config.heartbeat_interval),
        ("maintenance_interval", config.maintenance_interval),
        ("statement_timeout", config.statement_timeout),
        ("keepalive", config.keepalive),
    ];
    for (name, value) in positive {
        if value.is_zero() {
            problems.push(format!("{name} must be longer than zero"));
        }
    }
    if config.heartbeat_timeout <= config.heartbeat_interval {
        problems.push(format!(
            "heartbeat_timeout ({:?}) must be longer than heartbeat_interval ({:?}), \
             or live tasks would be recovered while they run",
            config.heartbeat_timeout, config.heartbeat_interval
        ));
    }
    for (name, value) in [
        ("heartbeat_timeout", config.heartbeat_timeout),
        ("retention", config.retention),
    ] {
        if let Err(e) = crate::options::delay_micros(value) {
            problems.push(format!("{name}: {e}"));
        }
    }
    problems
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
