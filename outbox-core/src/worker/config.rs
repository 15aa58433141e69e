//! The worker's settings, their defaults, and the checks `build` runs on
//! them.

use std::time::Duration;

use super::MAX_CONCURRENCY;
use crate::clock::Clock;

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
    /// The most tasks one claim takes (claims are also capped by free slots,
    /// the running ones and the claim-ahead buffer's). The default, 1000,
    /// lets one claim refill a fast queue's whole buffer: with 100, a drain
    /// of no-op tasks made three times as many claims and ran about 30%
    /// slower (PERFORMANCE.md, "Claims of up to 1,000").
    pub max_claim_batch: usize,
    /// The most tasks a queue's producer may hold claimed beyond its
    /// running slots (0: claim only what can start now). The buffer follows
    /// the rate at which this worker starts the queue's tasks: it holds at
    /// most what starts within `claim_ahead_window`, so slow handlers get
    /// little or none (see the guide on claim-ahead). The default, 1000,
    /// binds only above 20,000 starts a second (at the default window):
    /// room for runs of a key's tasks, each of which keeps its place from
    /// its claim to its last task. The runs waiting for an outcome are
    /// added to the buffer, up to its own size again and within this cap.
    pub claim_ahead: usize,
    /// How long, at the queue's current pace, a claimed-ahead task may wait
    /// for its slot: the buffer holds what this worker starts in this time.
    pub claim_ahead_window: Duration,
    /// The most tasks of one ordering key a claim, or an outcome that hands
    /// the key on, takes together (a run): the key's next task and up to
    /// this many minus one waiting behind it, run here one after the other
    /// without handing the key on between them. Only in queues without limits that run one task per key at a
    /// time. 1: each claim takes a key's next task alone. The default, 16,
    /// drained 1,000 keys faster than 8 or 32 (PERFORMANCE.md, "Runs
    /// without a hand-on at their end").
    pub key_run: usize,
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
    /// heartbeat intervals long. A worker that has not had a heartbeat
    /// confirmed for three quarters of it, less `cancel_grace`, stops its
    /// handlers and puts their tasks back (see worker/heartbeat.rs).
    pub heartbeat_timeout: Duration,
    /// Whether this worker takes part in maintenance (recovery, cleanup).
    /// One worker of the cluster leads at a time.
    pub maintenance: bool,
    /// How often the maintenance leader runs recovery, and how often the
    /// other workers try to take over the role.
    pub maintenance_interval: Duration,
    /// How long successful tasks are kept in the history before cleanup
    /// drops them (a partition goes once its end is this old).
    pub retention: Duration,
    /// How much time one partition of the history covers (daily by
    /// default). The maintenance leader creates them two widths ahead.
    pub history_partition: Duration,
    /// The longest the event log keeps a day of events that some
    /// subscription has not published yet (a relay stopped for good, or
    /// left behind): after this its partition is dropped anyway, and the
    /// `outbox_event_log_forced_drops_total` metric counts it. Partitions
    /// every subscription has passed go within the hour after their day.
    pub event_log_max_age: Duration,
    /// How long dead tasks are kept before the maintenance leader deletes
    /// them (`None`, the default: kept until an operator acts). Never
    /// deleted: a dead task that holds its ordering key (its key waits for
    /// an operator), and a workflow's step while its workflow is kept. At
    /// least an hour.
    pub dead_retention: Option<Duration>,
    /// How far a failed task's retry may move from its retry table's delay,
    /// in percent either way (0 to 100; default 10): a table's "1m" waits
    /// 54 to 66 s, so tasks that failed together do not all come back in
    /// the same second. A handler's `Outcome::RetryAfter` is kept exact.
    pub retry_jitter_percent: u32,
    /// Delete successful tasks at once instead of keeping them as COMPLETED
    /// history (a retention of zero). Cheaper for the database; FAILED and
    /// dead rows are kept either way (dead ones until `dead_retention`).
    pub delete_completed: bool,
    /// The maintenance leader vacuums `outbox_tasks` when it holds more dead
    /// row versions than this (and than a tenth of its live rows): each
    /// claim leaves one in the claim index's path until a vacuum removes it,
    /// and autovacuum comes by once a minute at most. 0 leaves it to
    /// autovacuum.
    pub vacuum_threshold: u64,
    /// How often the leader runs cleanup.
    pub cleanup_interval: Duration,
    /// How long after a worker stopped reporting itself (killed, or its
    /// machine lost) maintenance removes its row from `outbox_workers`.
    pub forget_workers_after: Duration,
    /// The maintenance leader warns while a session of the database has
    /// held a snapshot open for longer than this (vacuum cannot clean the
    /// task table behind it).
    pub snapshot_age_warning: Duration,
    /// Whether to LISTEN for submit notifications.
    pub listen: bool,
    /// Whether the worker's sessions go through a connection pooler in
    /// transaction mode (PgBouncer's `pool_mode = transaction`): each of
    /// its calls is then one transaction carrying its limits as `SET
    /// LOCAL`, no statement is cached, and the vacuum of the task table is
    /// left to autovacuum (VACUUM cannot run in a transaction). A LISTEN
    /// through such a pooler would hear nothing, so the worker polls every
    /// `poll_interval` unless [`WorkerConfig::listen_options`] gives it a
    /// direct connection for notifications. See [`crate::pooler`].
    pub pooler: bool,
    /// Where to LISTEN for notifications, when not on the worker's own
    /// sessions' server: the database itself (not the pooler) for a worker
    /// behind a pooler. The worker's limits and application_name are
    /// applied to it. None: the worker's own connection options, or no
    /// LISTEN at all behind a pooler.
    pub listen_options: Option<sqlx::postgres::PgConnectOptions>,
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
            max_claim_batch: 1000,
            claim_ahead: 1000,
            claim_ahead_window: Duration::from_millis(50),
            key_run: 16,
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
            dead_retention: None,
            retry_jitter_percent: crate::retry::DEFAULT_RETRY_JITTER_PERCENT,
            history_partition: Duration::from_secs(24 * 3600),
            event_log_max_age: Duration::from_secs(14 * 24 * 3600),
            delete_completed: false,
            vacuum_threshold: 10_000,
            cleanup_interval: Duration::from_secs(60),
            forget_workers_after: Duration::from_secs(3600),
            snapshot_age_warning: Duration::from_secs(300),
            listen: true,
            pooler: false,
            listen_options: None,
            clock: Clock::database(),
            worker_id: default_worker_id(),
        }
    }
}

/// Settings that would break the worker: every problem, for the list
/// `build` refuses to start with.
pub(super) fn config_problems(config: &WorkerConfig, queues: &[(String, usize)]) -> Vec<String> {
    let mut problems = Vec::new();
    // (A concurrency of zero is the registry's to report.)
    for (queue, concurrency) in queues {
        if *concurrency > MAX_CONCURRENCY {
            problems.push(format!(
                "queue {queue:?} has concurrency {concurrency}: use 1 to {MAX_CONCURRENCY}"
            ));
        }
    }
    if config.claim_ahead > MAX_CONCURRENCY {
        problems.push(format!(
            "claim_ahead is {}: use 0 to {MAX_CONCURRENCY}",
            config.claim_ahead
        ));
    }
    let positive = [
        ("poll_interval", config.poll_interval),
        ("heartbeat_interval", config.heartbeat_interval),
        ("maintenance_interval", config.maintenance_interval),
        ("statement_timeout", config.statement_timeout),
        ("keepalive", config.keepalive),
        ("claim_ahead_window", config.claim_ahead_window),
        ("snapshot_age_warning", config.snapshot_age_warning),
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
    if let Err(e) = crate::maintenance::check_history_partition(config.history_partition) {
        problems.push(format!("history_partition: {e}"));
    }
    for (name, value) in [
        ("heartbeat_timeout", config.heartbeat_timeout),
        ("retention", config.retention),
        ("event_log_max_age", config.event_log_max_age),
        ("forget_workers_after", config.forget_workers_after),
    ] {
        if let Err(e) = crate::options::delay_micros(value) {
            problems.push(format!("{name}: {e}"));
        }
    }
    if config.retry_jitter_percent > 100 {
        problems.push(format!(
            "retry_jitter_percent is {}: use 0 to 100",
            config.retry_jitter_percent
        ));
    }
    if let Some(value) = config.dead_retention {
        if value < Duration::from_secs(3600) {
            problems.push(format!(
                "dead_retention ({value:?}) must be at least an hour: a task just cancelled or \
                 dead would be gone before anyone looked at it"
            ));
        } else if let Err(e) = crate::options::delay_micros(value) {
            problems.push(format!("dead_retention: {e}"));
        }
    }
    problems
}

/// `host:pid:random`, unique enough to tell workers apart on the rows.
fn default_worker_id() -> String {
    let random = crate::random::u64() & 0xffff_ffff;
    format!("{}:{}:{random:08x}", host_name(), std::process::id())
}

/// This machine's name, as the kernel or the environment has it.
pub(super) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}
