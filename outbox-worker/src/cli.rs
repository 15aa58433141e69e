//! The command line: argument parsing, exit codes, and `run` / `migrate`.
//! Operator commands (`tasks`, `stats`) are in `admin_cmd`, `demo` in
//! `demo`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use outbox::{Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

use crate::admin_cmd::{StatsArgs, TasksCommand};
use crate::builtin;
use crate::connect::{DbArgs, connect_migrated, connect_operator};
use crate::demo::DemoArgs;
use crate::failure::Failure;
use crate::flags::{self, DAY, HOUR, MINUTE, MS, SECOND};
use crate::signals::stop_on_signal;

pub use crate::failure::{
    EXIT_CONFIG, EXIT_DATABASE_UNREACHABLE, EXIT_OUTCOME_UNKNOWN, EXIT_RUNTIME, EXIT_SCHEMA_BEHIND,
};

pub use crate::Register;

#[derive(Debug, Parser)]
#[command(
    name = "outbox-worker",
    version,
    about = "Run and operate outbox task workers on PostgreSQL",
    after_help = "Exit codes: 0 ok, 1 runtime failure, 2 bad configuration or input, \
                  3 database unreachable, 4 schema behind (run `migrate`), 5 a write's \
                  commit outcome unknown (the message names its id and a safe retry)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log filter, RUST_LOG syntax (e.g. info, outbox=debug); default info
    /// (error for `demo`, whose failures are on purpose).
    #[arg(long, env = "OUTBOX_LOG", global = true)]
    log: Option<String>,
    /// Log line format.
    #[arg(long, env = "OUTBOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// How long an operator command (every one but `run`, `demo`, `bench`
    /// and `dashboard`) may take before it gives up (exit 3), e.g. when a
    /// lock holds it (1s to 1d).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_COMMAND_TIMEOUT", default_value = "60s", global = true, value_parser = flags::duration(SECOND, DAY))]
    command_timeout: Duration,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run workers until SIGTERM or SIGINT.
    Run(RunArgs),
    /// Apply pending schema migrations and report the version.
    Migrate(MigrateArgs),
    /// Submit, list, show, retry and cancel tasks.
    #[command(subcommand)]
    Tasks(TasksCommand),
    /// Counts by state and task type, dead tasks, backlog age, in-flight.
    Stats(StatsArgs),
    /// Start a private PostgreSQL (unless DATABASE_URL is set), submit a mixed
    /// workload and run it to the end.
    Demo(DemoArgs),
    /// Burn-down benchmark: insert, submit, drain and pickup-latency figures.
    Bench(crate::bench::BenchArgs),
    /// List periodic tasks; delete one removed from the code.
    #[command(subcommand)]
    Periodic(crate::periodic_cmd::PeriodicCommand),
    /// Serve the web dashboard (authenticated; see --help).
    Dashboard(crate::dashboard_cmd::DashboardArgs),
    /// List queues with their settings; pause, resume and limit them for
    /// the whole cluster; delete one left behind.
    #[command(subcommand)]
    Queues(crate::queues_cmd::QueuesCommand),
    /// List the workers of the cluster.
    #[command(subcommand)]
    Workers(crate::queues_cmd::WorkersCommand),
    /// Emit an event; show, retry and skip what relays hold back; list, rewind and delete subscriptions.
    #[command(subcommand)]
    Events(crate::events_cmd::EventsCommand),
    /// List, show and cancel workflows.
    #[command(subcommand)]
    Workflows(crate::workflows_cmd::WorkflowsCommand),
}

#[derive(Debug, Args)]
struct MigrateArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The longest a migration waits for a table's lock (100ms to 1m, and
    /// at most a quarter of --command-timeout; default 2s, or that quarter
    /// if less). The outbox's own statements on that table queue behind it
    /// meanwhile; when it times out the migration is rolled back and tried
    /// again, for half of --command-timeout.
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_LOCK_TIMEOUT", value_parser = flags::duration(100 * MS, MINUTE))]
    lock_timeout: Option<Duration>,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Queues to serve as NAME=CONCURRENCY (repeatable, or comma-separated;
    /// concurrency 1 to 100000); default: every queue of the registered task
    /// types, 10 each.
    #[arg(long = "queue", env = "OUTBOX_QUEUES", value_delimiter = ',', value_parser = parse_queue)]
    queues: Vec<(String, usize)>,
    /// The most tasks each queue may hold claimed beyond its running slots,
    /// so the next claim overlaps the running tasks (0 to 100000; 0 claims
    /// only what can start). The buffer holds at most what starts within
    /// --claim-ahead-window at the queue's pace, so slow handlers get
    /// little or none, plus the key runs waiting for an outcome (up to as
    /// many again, within this cap); queues with a global concurrency or a
    /// rate get none.
    #[arg(long, env = "OUTBOX_CLAIM_AHEAD", default_value_t = 1000, value_parser = flags::count(0, outbox::MAX_CONCURRENCY as u64))]
    claim_ahead: usize,
    /// How long a claimed-ahead task may wait for its slot at the queue's
    /// pace (1ms to 1h): the buffer holds what starts in this time.
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_CLAIM_AHEAD_WINDOW", default_value = "50ms", value_parser = flags::duration(MS, HOUR))]
    claim_ahead_window: Duration,
    /// The most tasks of one ordering key a claim or a hand-on takes
    /// together (1 to 10000): the key's next task and those waiting behind
    /// it, run here one after the other without a hand-over between them. 1 takes a
    /// key's next task alone. Only in queues without limits that run one
    /// task per key at a time.
    #[arg(long, env = "OUTBOX_KEY_RUN", default_value_t = 16, value_parser = flags::count(1, 10_000))]
    key_run: usize,
    /// Fallback poll interval (NOTIFY wakes workers sooner), e.g. 1s, 250ms
    /// (1ms to 1h).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_POLL_INTERVAL", default_value = "1s", value_parser = flags::duration(MS, HOUR))]
    poll_interval: Duration,
    /// How long in-flight tasks may finish after SIGTERM/SIGINT before they
    /// are cancelled and put back for another worker (0s to 1d). A second
    /// signal exits at once.
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_SHUTDOWN_GRACE", default_value = "30s", value_parser = flags::duration(Duration::ZERO, DAY))]
    shutdown_grace: Duration,
    /// At shutdown, how long outcomes the database has not taken yet (it may
    /// be down) are retried, and unfinished tasks released, before exit (1s
    /// to 1h).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_FLUSH_TIMEOUT", default_value = "5s", value_parser = flags::duration(SECOND, HOUR))]
    flush_timeout: Duration,
    /// Server-side statement_timeout of the worker's own statements; the
    /// worker gives up on a call one second later and reconnects (100ms to
    /// 1h).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_STATEMENT_TIMEOUT", default_value = "5s", value_parser = flags::duration(100 * MS, HOUR))]
    statement_timeout: Duration,
    /// How long a silent connection lasts before either side drops it (TCP
    /// keepalives, tcp_user_timeout, pings of the LISTEN connection; 1s to
    /// 1h).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_KEEPALIVE", default_value = "10s", value_parser = flags::duration(SECOND, HOUR))]
    keepalive: Duration,
    /// How often in-flight tasks' heartbeats are written (one statement;
    /// 100ms to 1h).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_HEARTBEAT_INTERVAL", default_value = "10s", value_parser = flags::duration(100 * MS, HOUR))]
    heartbeat_interval: Duration,
    /// A task whose heartbeat is older than this is recovered (counts as an
    /// attempt); keep it several heartbeat intervals long (1s to 7d).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_HEARTBEAT_TIMEOUT", default_value = "5m", value_parser = flags::duration(SECOND, 7 * DAY))]
    heartbeat_timeout: Duration,
    /// How often the maintenance leader runs recovery (and others campaign;
    /// 10ms to 1h).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_MAINTENANCE_INTERVAL", default_value = "5s", value_parser = flags::duration(10 * MS, HOUR))]
    maintenance_interval: Duration,
    /// How long successful tasks are kept in the history before cleanup drops
    /// them, a partition at a time (each is dropped once its end is this
    /// old); 0 deletes successful tasks at once (cheapest; no history; up
    /// to 3650d).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_RETENTION", default_value = "7d", value_parser = flags::duration(Duration::ZERO, 3650 * DAY))]
    retention: Duration,
    /// How long dead tasks are kept before the maintenance leader deletes
    /// them (1h to 3650d; without it they stay until an operator acts). A
    /// dead task that holds its ordering key, and a workflow's step while
    /// its workflow is kept, stay however old.
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_DEAD_RETENTION", value_parser = flags::duration(HOUR, 3650 * DAY))]
    dead_retention: Option<Duration>,
    /// How far a failed task's retry may move from its retry table's delay,
    /// in percent either way, so tasks that failed together come back
    /// spread out (0 to 100; 0 keeps the table's delays exact).
    #[arg(long, env = "OUTBOX_RETRY_JITTER", default_value_t = outbox::retry::DEFAULT_RETRY_JITTER_PERCENT as usize, value_parser = flags::count(0, 100))]
    retry_jitter: usize,
    /// The maintenance leader vacuums the task table once it holds more dead
    /// row versions than this (and than a tenth of its live rows), rather
    /// than wait for autovacuum; 0 leaves it to autovacuum (0 to 1000000000).
    #[arg(long, env = "OUTBOX_VACUUM_THRESHOLD", default_value_t = 10_000, value_parser = flags::count_u64(0, 1_000_000_000))]
    vacuum_threshold: u64,
    /// How much time one partition of the history covers; the maintenance
    /// leader creates them two ahead (1m to 366d).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_HISTORY_PARTITION", default_value = "1d", value_parser = flags::duration(MINUTE, 366 * DAY))]
    history_partition: Duration,
    /// The longest the event log keeps a day of events some subscription
    /// has not published yet (a relay stopped for good): the day is dropped
    /// anyway after this, and `outbox_event_log_forced_drops_total` counts
    /// it. Days every subscription has passed go within the hour after
    /// their end (1d to 3650d).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_EVENT_LOG_MAX_AGE", default_value = "14d", value_parser = flags::duration(DAY, 3650 * DAY))]
    event_log_max_age: Duration,
    /// How long after a worker stopped reporting itself (killed, machine
    /// lost) its row leaves `workers list` (1s to 30d).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_FORGET_WORKERS_AFTER", default_value = "1h", value_parser = flags::duration(SECOND, 30 * DAY))]
    forget_workers_after: Duration,
    /// The maintenance leader warns while a session of the database holds a
    /// snapshot open for longer than this: vacuum cannot clean the task
    /// table behind it (1s to 7d).
    #[arg(allow_hyphen_values = true, long, env = "OUTBOX_WARN_SNAPSHOT_AGE", default_value = "5m", value_parser = flags::duration(SECOND, 7 * DAY))]
    warn_snapshot_age: Duration,
    /// Take no part in maintenance (recovery and cleanup run on other workers).
    #[arg(long, env = "OUTBOX_NO_MAINTENANCE")]
    no_maintenance: bool,
    /// With --pooler: a URL that reaches PostgreSQL directly (not through
    /// the pooler), used only to LISTEN for notifications, so that workers
    /// start new tasks at once instead of at the next poll.
    #[arg(
        long,
        env = "OUTBOX_LISTEN_URL",
        hide_env_values = true,
        requires = "pooler"
    )]
    listen_url: Option<String>,
    /// Database connections in the pool handlers use (`ctx.pool()`; 1 to
    /// 10000); the worker's own statements have a small pool of their own.
    #[arg(long, env = "OUTBOX_MAX_CONNECTIONS", default_value_t = 10, value_parser = flags::count_u32(1, 10_000))]
    max_connections: u32,
    /// Serve Prometheus /metrics, /health (liveness) and /ready (503 while
    /// the database is unreachable) on this address (e.g. 0.0.0.0:9090).
    #[arg(long, env = "OUTBOX_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// A periodic task, as 'NAME=SCHEDULE TYPE JSON' (repeatable): the
    /// schedule is `every 30s` or a cron expression (seconds optional,
    /// or @hourly, @daily...; UTC, or `CRON_TZ=Europe/Paris 0 3 * * *`).
    /// The cluster's maintenance leader enqueues each tick once. In
    /// OUTBOX_PERIODIC, one per line.
    #[arg(
        long = "periodic",
        env = "OUTBOX_PERIODIC",
        value_delimiter = '\n',
        value_parser = crate::periodic_cmd::parse_spec
    )]
    periodic: Vec<crate::periodic_cmd::PeriodicSpec>,
    /// Relay events to a broker, as NAME=URL (repeatable; in OUTBOX_RELAYS,
    /// separated by spaces). Each sink is a cargo feature (nats, kafka,
    /// rabbitmq, redis, webhook; all-sinks for all): the default build has
    /// none. The scheme picks the sink: nats://,
    /// kafka://HOST:PORT[,HOST:PORT...], amqp:// (RabbitMQ), redis://,
    /// http:// or https:// (webhooks). Query parameters set queue (default
    /// events), concurrency (default 256; Kafka 1024), route (default
    /// outbox.event.{aggregate_type}), give_up_after, timeout_ms and the
    /// sink's own options. Secrets never go in the URL: the relay reads
    /// OUTBOX_RELAY_<NAME>_SECRET. Example:
    /// --relay 'nats=nats://127.0.0.1:4222?stream=EVENTS'
    #[arg(long = "relay", env = "OUTBOX_RELAYS", value_delimiter = ' ', value_parser = parse_relay)]
    relays: Vec<(String, String)>,
}

fn parse_relay(s: &str) -> Result<(String, String), String> {
    // The value arrives split at spaces (OUTBOX_RELAYS lists relays that
    // way), so a part may be a word of what was typed.
    let refused = || {
        format!(
            "{s:?} is not NAME=URL (for example nats=nats://127.0.0.1:4222; spaces separate \
             relays, so a URL must not contain one)"
        )
    };
    let (name, url) = s.split_once('=').ok_or_else(refused)?;
    if name.is_empty() || url.is_empty() {
        return Err(refused());
    }
    Ok((name.to_owned(), url.to_owned()))
}

fn parse_queue(s: &str) -> Result<(String, usize), String> {
    // `OUTBOX_QUEUES="a=2, b=3"`: the space after a comma is not the name's.
    let s = s.trim();
    let (name, concurrency) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=CONCURRENCY (for example default=10)"))?;
    let max = outbox::MAX_CONCURRENCY;
    let concurrency: usize = concurrency
        .parse()
        .ok()
        .filter(|c| (1..=max).contains(c))
        .ok_or_else(|| {
            format!("concurrency {concurrency:?} of queue {name:?} is not a whole number from 1 to {max}")
        })?;
    if name.is_empty() {
        return Err(format!("{s:?} has no queue name before '='"));
    }
    Ok((name.to_owned(), concurrency))
}

/// Runs the stock CLI: the built-in diagnostic task types and every task
/// type linked into the binary.
pub fn main() -> ExitCode {
    main_with(|builder| builder)
}

/// Set by the hook of [`quiet_when_the_reader_is_gone`] when a command's
/// `println!` found its reader gone.
static READER_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Lets an operator command whose output has no reader any more (`events
/// parked | head`) end with success, saying nothing: Rust ignores
/// SIGPIPE, so `println!` panics on the closed pipe instead, with exit code
/// 101 and a panic message among the reader's lines. The reader asked for
/// no more; that is not the command's failure. Only that panic, and only
/// on the main thread (where the command runs and prints): it still
/// unwinds, so everything is dropped as after any panic, and
/// [`main_with`] turns it into success. Not for `run`, `demo`, `bench`
/// or `dashboard`, whose handlers may print and whose processes must stop
/// as they always do.
fn quiet_when_the_reader_is_gone() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        // EPIPE's number, not its text, which the C library may translate.
        if message.starts_with("failed printing to stdout")
            && message.ends_with("(os error 32)")
            && std::thread::current().name() == Some("main")
        {
            READER_GONE.store(true, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        report(info);
    }));
}

/// The command line, with negative numbers read as values everywhere: a
/// flag given `-1` then hears it and names its range, where clap would say
/// `-1` is an unknown argument and suggest `-- -1`.
fn parse() -> Cli {
    fn negatives_are_values(command: clap::Command) -> clap::Command {
        command
            .allow_negative_numbers(true)
            .mut_subcommands(negatives_are_values)
    }
    let command = negatives_are_values(<Cli as clap::CommandFactory>::command());
    let matches = command.get_matches();
    <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Runs the CLI for an application's own worker binary: `register` adds the
/// application's handlers to every worker the CLI builds (the built-in
/// handlers are always added). It may be a plain `fn` or a closure that
/// captures state built in `main` (an HTTP client, settings); the builder it
/// receives carries the pool opened on the operator's `--database-url`
/// ([`outbox::WorkerBuilder::pool`]), so handlers that keep a pool never
/// re-read the environment.
///
/// ```no_run
/// # use outbox::WorkerBuilder;
/// # #[derive(Clone)] struct Mailer;
/// fn main() -> std::process::ExitCode {
///     let mailer = Mailer; // built once, shared by every worker the CLI builds
///     outbox_worker::main_with(move |w: WorkerBuilder| {
///         let _pool = w.pool().clone(); // the pool `--database-url` opened
///         let _mailer = mailer.clone();
///         w // .handler::<SendWelcome>(Welcome { pool: _pool, mailer: _mailer })
///     })
/// }
/// ```
pub fn main_with(
    register: impl Fn(outbox::WorkerBuilder) -> outbox::WorkerBuilder + Send + Sync + 'static,
) -> ExitCode {
    let register: Register = std::sync::Arc::new(register);
    let cli = parse();
    if !matches!(
        cli.command,
        Command::Run(_) | Command::Demo(_) | Command::Bench(_) | Command::Dashboard(_)
    ) {
        quiet_when_the_reader_is_gone();
    }
    let default_log = if matches!(cli.command, Command::Demo(_)) {
        "error"
    } else {
        "info"
    };
    let tracing = match init_tracing(cli.log.as_deref().unwrap_or(default_log), cli.log_format) {
        Ok(guard) => guard,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            return ExitCode::from(failure.code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let limit = cli.command_timeout;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(async move {
            match cli.command {
                Command::Run(args) => run(args, &register).await,
                Command::Migrate(args) => within(limit, migrate(args, limit)).await,
                Command::Tasks(command) => within(limit, crate::admin_cmd::tasks(command)).await,
                Command::Stats(args) => within(limit, crate::admin_cmd::stats(args)).await,
                Command::Demo(args) => crate::demo::run(args, &register).await,
                Command::Bench(args) => crate::bench::run(args, register.clone()).await,
                Command::Dashboard(args) => crate::dashboard_cmd::run(args).await,
                Command::Periodic(command) => {
                    within(limit, crate::periodic_cmd::run(command)).await
                }
                Command::Queues(command) => within(limit, crate::queues_cmd::queues(command)).await,
                Command::Workers(command) => {
                    within(limit, crate::queues_cmd::workers(command)).await
                }
                Command::Events(command) => within(limit, crate::events_cmd::run(command)).await,
                Command::Workflows(command) => {
                    within(limit, crate::workflows_cmd::run(command)).await
                }
            }
        })
    }));
    let result = match result {
        Ok(result) => result,
        Err(_) if READER_GONE.load(std::sync::atomic::Ordering::Relaxed) => Ok(()),
        Err(panic) => std::panic::resume_unwind(panic),
    };
    // Whatever is still running (a handler that never yields, a connection
    // stuck in a silent network) must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_secs(1));
    tracing.finish();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// An operator command, given up after `limit`.
async fn within(
    limit: Duration,
    command: impl Future<Output = Result<(), Failure>>,
) -> Result<(), Failure> {
    tokio::time::timeout(limit, command)
        .await
        .unwrap_or_else(|_| {
            let written = if crate::commit::given_up()? {
                " (nothing was written: its transaction never reached COMMIT)"
            } else {
                ""
            };
            Err(Failure::unreachable(format!(
                "the database did not finish this command within {} (--command-timeout){written}: \
             is a lock holding it, or is the server overloaded?",
                humantime::format_duration(limit)
            )))
        })
}

/// How long `migrate` waits for a table's lock unless told.
const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

async fn migrate(args: MigrateArgs, limit: Duration) -> Result<(), Failure> {
    // Retries end before the command's own limit, so a lock held all along
    // is reported as such, with the migration it held up: each wait takes
    // at most a quarter of the limit, and the last try starts within its
    // first half.
    let lock_timeout = match args.lock_timeout {
        None => DEFAULT_LOCK_TIMEOUT.min(limit / 4),
        Some(asked) if asked > limit / 4 => {
            return Err(Failure::config(format!(
                "--lock-timeout ({}) must be at most a quarter of --command-timeout ({}): \
                 lower it, or raise --command-timeout to at least {}",
                humantime::format_duration(asked),
                humantime::format_duration(limit),
                humantime::format_duration(asked * 4)
            )));
        }
        Some(asked) => asked,
    };
    let pool = connect_operator(&args.db, 2).await?;
    let options = outbox::MigrateOptions {
        lock_timeout,
        retry_for: limit / 2,
    };
    let report = outbox::migrate_with(&pool, outbox::latest_version(), options).await?;
    if report.applied.is_empty() {
        println!("schema is up to date at version {}", report.current);
    } else {
        println!(
            "applied migrations {:?}; schema is at version {}",
            report.applied, report.current
        );
    }
    Ok(())
}

async fn run(args: RunArgs, register: &Register) -> Result<(), Failure> {
    if args.heartbeat_timeout <= args.heartbeat_interval {
        return Err(Failure::config(format!(
            "--heartbeat-timeout ({}) must be longer than --heartbeat-interval ({}), \
             or live tasks would be recovered while they run",
            humantime::format_duration(args.heartbeat_timeout),
            humantime::format_duration(args.heartbeat_interval)
        )));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some((queue, _)) = args.queues.iter().find(|(q, _)| !seen.insert(q)) {
        return Err(Failure::config(format!(
            "queue {queue:?} is given twice in --queue; give each queue once"
        )));
    }
    // The builder keeps the last of a name; on the command line two are a
    // mistake, as two relays of one name are.
    let mut seen = std::collections::HashSet::new();
    if let Some(spec) = args.periodic.iter().find(|p| !seen.insert(p.name())) {
        return Err(Failure::config(format!(
            "two periodic tasks are named {:?}: give each --periodic its own name",
            spec.name()
        )));
    }
    // Bind now: a port in use is a configuration error at start-up, not a
    // surprise at shutdown.
    let metrics = match args.metrics_addr {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| Failure::config(format!("cannot serve metrics on {addr}: {e}")))?;
            Some((
                listener,
                crate::metrics::install().map_err(Failure::runtime)?,
            ))
        }
        None => None,
    };
    let pool = connect_migrated(&args.db, args.max_connections).await?;
    let listen_options = match &args.listen_url {
        Some(url) => {
            let options = url.parse().map_err(|e| {
                Failure::config(format!("--listen-url is not a valid PostgreSQL URL: {e}"))
            })?;
            crate::connect::check_listen_url(&options).await?;
            Some(options)
        }
        None => None,
    };
    let config = WorkerConfig {
        pooler: args.db.pooler,
        listen_options,
        poll_interval: args.poll_interval,
        claim_ahead: args.claim_ahead,
        claim_ahead_window: args.claim_ahead_window,
        key_run: args.key_run,
        shutdown_grace: args.shutdown_grace,
        flush_timeout: args.flush_timeout,
        statement_timeout: args.statement_timeout,
        keepalive: args.keepalive,
        heartbeat_interval: args.heartbeat_interval,
        heartbeat_timeout: args.heartbeat_timeout,
        maintenance: !args.no_maintenance,
        maintenance_interval: args.maintenance_interval,
        retention: args.retention,
        dead_retention: args.dead_retention,
        retry_jitter_percent: u32::try_from(args.retry_jitter).unwrap_or(100),
        history_partition: args.history_partition,
        event_log_max_age: args.event_log_max_age,
        vacuum_threshold: args.vacuum_threshold,
        delete_completed: args.retention.is_zero(),
        forget_workers_after: args.forget_workers_after,
        snapshot_age_warning: args.warn_snapshot_age,
        ..WorkerConfig::default()
    };
    let mut builder = register(builtin::register(
        Worker::builder(pool.clone()).config(config),
    ));
    for (queue, concurrency) in args.queues {
        builder = builder.queue(queue, concurrency);
    }
    for spec in &args.periodic {
        builder = builder.periodic(crate::periodic_cmd::resolve(spec)?);
    }
    // Before any relay is built, so that a refusal is all it prints (a
    // webhook relay's build warns when unsigned).
    let mut names = std::collections::HashSet::new();
    if let Some((name, _)) = args.relays.iter().find(|(n, _)| !names.insert(n)) {
        return Err(Failure::config(format!("two relays are named {name:?}")));
    }
    let mut recorded = Vec::new();
    for (name, url) in &args.relays {
        let mut relay = outbox::relay::Relay::from_url(name, url)
            .await
            .map_err(|e| Failure::config(with_build_hint(e, url)))?;
        look_before_start(&mut relay).await?;
        recorded.push((
            name.clone(),
            relay.queue_name().to_owned(),
            relay.sink_kind(),
        ));
        builder = builder.relay(relay);
    }
    let worker = builder.build()?;
    let relays = worker.relays().to_vec();
    refuse_relays_of_other_subscriptions(&pool, &recorded).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let server = match metrics {
        Some((listener, handle)) => {
            let server = crate::metrics::serve(listener, handle, pool, relays, shutdown.clone());
            Some(tokio::spawn(server))
        }
        None => None,
    };
    worker.run(shutdown.clone()).await?;
    if let Some(server) = server {
        match server.await {
            Ok(Err(e)) => return Err(Failure::runtime(format!("metrics server: {e}"))),
            Err(e) => return Err(Failure::runtime(e)),
            Ok(Ok(())) => {}
        }
    }
    Ok(())
}

/// `error` with the command that builds this binary with the sink `url`
/// needs, when the sink's feature is what is missing.
fn with_build_hint(error: String, url: &str) -> String {
    let scheme = url.split("://").next().unwrap_or_default();
    let missing = outbox::relay::sink_kinds()
        .into_iter()
        .find(|(schemes, _, built)| {
            !built
                && schemes
                    .split('/')
                    .any(|s| s == scheme || format!("{s}s") == scheme)
        });
    match missing {
        Some((_, feature, _)) if error.contains("no sink for URL scheme") => format!(
            "{error}\n  build the worker with it: cargo build --release -p outbox-worker \
             --features {feature} (or --features all-sinks)"
        ),
        _ => error,
    }
}

/// Refuses a relay whose broker answers that what it publishes to does not
/// exist (no NATS stream on its subjects, no RabbitMQ exchange): every
/// publish would fail, retried for ever as an outage. A broker that cannot
/// be asked now is only warned about: the relay retries it as any outage.
async fn look_before_start(relay: &mut outbox::relay::Relay) -> Result<(), Failure> {
    match relay.preflight().await {
        Ok(()) => Ok(()),
        Err(outbox::relay::Preflight::Missing(why)) => {
            Err(Failure::config(format!("relay {:?}: {why}", relay.name())))
        }
        Err(outbox::relay::Preflight::Unreachable(why)) => {
            tracing::warn!(
                relay = relay.name(),
                "{why}; the worker starts, and the relay retries as for any outage"
            );
            Ok(())
        }
    }
}

/// Refuses a relay whose existing subscription recorded another stream or
/// another kind of sink than the relay has (the relay itself would log an
/// error and not run): one naming another stream would publish events its
/// sink was not set up for, and one deployed under a taken name with
/// another kind of sink would send the subscription's events to another
/// broker than its consumers read.
async fn refuse_relays_of_other_subscriptions(
    pool: &sqlx::PgPool,
    relays: &[(String, String, &'static str)],
) -> Result<(), Failure> {
    for (name, stream, kind) in relays {
        let Some(recorded) = outbox::relay::subscription_record(pool, name).await? else {
            continue;
        };
        if &recorded.stream != stream {
            let subscribed = &recorded.stream;
            return Err(Failure::config(format!(
                "relay {name:?} reads stream {stream:?}, but its subscription reads \
                 {subscribed:?} (set when it was created): give the relay queue={subscribed}, \
                 or delete the subscription with `outbox-worker events delete-subscription \
                 {name}` (a new one starts where the relay's start= says)"
            )));
        }
        if let Some(subscribed) = recorded.sink.filter(|s| s != kind) {
            return Err(Failure::config(format!(
                "relay {name:?} publishes to {kind}, but its subscription publishes to \
                 {subscribed}: name this relay otherwise, or, to move the subscription to \
                 another broker, delete it with `outbox-worker events delete-subscription \
                 {name}` and start the new relay with start= at the position `events \
                 subscriptions` showed"
            )));
        }
    }
    Ok(())
}

/// What has to be done at exit for the tracing set up at start.
struct TracingGuard {
    #[cfg(feature = "otel")]
    exporter: Option<crate::otel::Exporter>,
}

impl TracingGuard {
    /// Flushes what is still buffered (the last spans, with `otel`).
    fn finish(self) {
        #[cfg(feature = "otel")]
        if let Some(exporter) = self.exporter {
            exporter.shutdown();
        }
    }
}

fn init_tracing(filter: &str, format: LogFormat) -> Result<TracingGuard, Failure> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let log_filter = tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| {
        Failure::config(format!(
            "--log {filter:?} is not a log filter ({e}); write it like info or outbox=debug,sqlx=warn"
        ))
    })?;
    // Colour only for a person at a terminal, not in log files.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let log = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let log = match format {
        LogFormat::Text => log.boxed(),
        LogFormat::Json => log.json().boxed(),
    };
    let registry = tracing_subscriber::registry().with(log.with_filter(log_filter));
    #[cfg(feature = "otel")]
    {
        let (layer, exporter) = crate::otel::layer(filter)?.unzip();
        let _ = registry.with(layer).try_init();
        Ok(TracingGuard { exporter })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = registry.try_init();
        Ok(TracingGuard {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_list_may_have_spaces_after_its_commas() {
        assert_eq!(parse_queue(" other=3"), Ok(("other".to_owned(), 3)));
        assert!(parse_queue(" =3").unwrap_err().contains("no queue name"));
    }
}
