//! `outbox-worker bench`: a burn-down benchmark that prints numbers.
//!
//! Phases, each on the `outbox-bench` queue so a shared database's real
//! queues are left alone (still: point it at a scratch database):
//! 1. single-task submits from several concurrent clients, in explicit
//!    transactions and as autocommit statements (rates), removed again;
//! 2. batch insert of N no-op tasks (rate);
//! 3. drain of the N tasks by one worker (committed completions per second,
//!    statements per task, peak resident memory);
//! 4. pickup latency on an idle queue (submit one task, time until its
//!    handler starts);
//! 5. with `--history-completed/--history-dead`: the operator views'
//!    queries (dashboard overview, task pages) timed on that much history
//!    plus N pending tasks, then the same burn-down again with the history
//!    in the table, and the ratio to step 3.
//!
//! Without DATABASE_URL it starts a private PostgreSQL with fsync on (as
//! a production server would run), in a temporary directory.

use std::time::{Duration, Instant};

use clap::Args;
use outbox::{
    Batch, HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, TaskOptions, Worker,
    WorkerConfig, outbox_task,
};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod business;
mod operator_views;
mod ordering;
mod relay;
mod retention;
mod workflows;

use crate::Register;
use crate::builtin::{Builtins, Noop};
use crate::connect::{connect_bench, database_or_private};
use crate::failure::Failure;
use crate::flags;
use crate::local_postgres::LocalPostgresOptions;

/// The queue every benchmark task goes to.
const QUEUE: &str = "outbox-bench";

/// `bench`'s flags.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Use this (scratch) database instead of a private one.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Tasks in the burn-down.
    #[arg(long, default_value_t = 200_000, value_parser = flags::count(1, 100_000_000))]
    tasks: usize,
    /// Worker concurrency during the drain.
    #[arg(long, default_value_t = 24, value_parser = flags::count(1, outbox::MAX_CONCURRENCY as u64))]
    concurrency: usize,
    /// Tasks each drain's worker may claim beyond its running slots (see
    /// `run --claim-ahead`).
    #[arg(long, default_value_t = 1000, value_parser = flags::count(0, outbox::MAX_CONCURRENCY as u64))]
    claim_ahead: usize,
    /// What each drain's claim-ahead buffer holds: the tasks that start in
    /// this time (see `run --claim-ahead-window`; 1ms to 1h).
    #[arg(allow_hyphen_values = true, long, default_value = "50ms", value_parser = flags::duration(Duration::from_millis(1), Duration::from_secs(3600)))]
    claim_ahead_window: Duration,
    /// Tasks of one ordering key each claim of the drains may take together
    /// (see `run --key-run`; 1 to 10000).
    #[arg(long, default_value_t = 16, value_parser = flags::count(1, 10_000))]
    key_run: usize,
    /// Tasks per insert transaction.
    #[arg(long, default_value_t = 5000, value_parser = flags::count(1, 1_000_000))]
    insert_batch: usize,
    /// Concurrent clients for the single-task submit phase.
    #[arg(long, default_value_t = 8, value_parser = flags::count(1, 1000))]
    submitters: usize,
    /// Single-task submits in that phase (0 skips it).
    #[arg(long, default_value_t = 40_000, value_parser = flags::count(0, 100_000_000))]
    single_submits: usize,
    /// Pickup-latency samples (0 skips the phase).
    #[arg(long, default_value_t = 1000, value_parser = flags::count(0, 1_000_000))]
    latency_samples: usize,
    /// COMPLETED rows to pre-fill for the history burn-down.
    #[arg(long, default_value_t = 0, value_parser = flags::count_u64(0, 100_000_000))]
    history_completed: u64,
    /// Dead rows to pre-fill for the history burn-down.
    #[arg(long, default_value_t = 0, value_parser = flags::count_u64(0, 100_000_000))]
    history_dead: u64,
    /// Completed tasks of a day past the retention, whose removal by cleanup
    /// is timed (0 skips; 1000000 is the figure of PERFORMANCE.md).
    #[arg(long, default_value_t = 0, value_parser = flags::count_u64(0, 100_000_000))]
    retention_rows: u64,
    /// After the main drain, drain this many tasks more (history kept) and
    /// compare its rate with the main drain's (0 skips; 1000000 is the
    /// long-drain figure of PERFORMANCE.md).
    #[arg(long, default_value_t = 0, value_parser = flags::count(0, 100_000_000))]
    long_drain: usize,
    /// After the main drain, drain this many tasks twice more (history
    /// kept): once as usual, once while another session holds a snapshot
    /// open for the whole drain (vacuum can remove nothing meanwhile); the
    /// second's rate over the first's (0 skips).
    #[arg(long, default_value_t = 0, value_parser = flags::count(0, 100_000_000))]
    held_snapshot_tasks: usize,
    /// Keep the held snapshot open at least this many seconds: the drain
    /// of `--held-snapshot-tasks` repeats (insert them, drain them) until
    /// it has been open this long, and the drain without it repeats for as
    /// long, so the rates compare a snapshot this old (0: one drain each).
    #[arg(long, default_value_t = 0, value_parser = flags::count_u64(0, 86_400))]
    held_snapshot_seconds: u64,
    /// Also drain with successful tasks deleted at once (retention 0).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    delete_mode: bool,
    /// A peer's burn-down to run on the same database in the same run, for a
    /// ratio: a shell command that reads DATABASE_URL and prints one JSON
    /// line with `drain_jobs_per_s` (see PERFORMANCE.md).
    /// Repeat it for several peers; `{tasks}` and `{concurrency}` in the
    /// command become this run's values.
    #[arg(long)]
    peer_command: Vec<String>,
    /// Print where the database's time went: the top statements from
    /// pg_stat_statements (private cluster only).
    #[arg(long)]
    statements: bool,
    /// Record metrics into the Prometheus recorder, as `run
    /// --metrics-addr` does (without it, the figures leave out what
    /// recording costs the engine and the relay).
    #[arg(long)]
    metrics: bool,
    #[command(flatten)]
    ordering: ordering::OrderingArgs,
    #[command(flatten)]
    workflows: workflows::WorkflowArgs,
    #[command(flatten)]
    business: business::BusinessArgs,
    #[command(flatten)]
    relay: relay::RelayArgs,
    /// Print one JSON object with every figure instead of text.
    #[arg(long)]
    json: bool,
}

/// A task whose handler reports the moment it starts.
#[derive(Debug, Serialize, Deserialize)]
#[outbox_task(task_type = "outbox.bench.probe", queue = "outbox-bench")]
struct Probe {}

#[derive(Clone)]
struct ProbeHandler(mpsc::UnboundedSender<Instant>);

impl TaskHandler<Probe> for ProbeHandler {
    async fn handle(&self, _ctx: TaskContext, _task: Probe) -> HandlerResult {
        let _ = self.0.send(Instant::now());
        Ok(Outcome::Success)
    }
}

/// Every figure the benchmark measured.
#[derive(Debug, Default, Serialize)]
struct Report {
    postgres: String,
    tasks: usize,
    concurrency: usize,
    claim_ahead: usize,
    claim_ahead_window_ms: f64,
    key_run: usize,
    insert_batch: usize,
    insert_tasks_per_s: f64,
    single_submit_clients: usize,
    single_submits: usize,
    /// BEGIN; submit; COMMIT per task.
    single_submit_tx_per_s: Option<f64>,
    /// One autocommit submit statement per task.
    single_submit_autocommit_per_s: Option<f64>,
    /// The same clients inserting one order row (primary key and one
    /// secondary index) per autocommit statement: what any one-row write
    /// reaches through this client on this machine in this run.
    single_submit_floor_per_s: Option<f64>,
    /// Burn-down with history kept: COMPLETED rows stay until cleanup.
    drain_tasks_per_s: f64,
    drain_seconds: f64,
    round_trips_per_task: f64,
    claim_queries: u64,
    finish_queries: u64,
    heartbeat_queries: u64,
    /// Burn-down with successful tasks deleted at once (retention 0).
    drain_delete_mode_tasks_per_s: Option<f64>,
    peak_rss_mb: Option<f64>,
    /// From the submit call to the handler's start (includes the submit's
    /// own commit).
    pickup_latency_ms: Option<Latency>,
    /// From the submit's commit returning to the handler's start (0 when
    /// the handler started first).
    pickup_after_commit_ms: Option<Latency>,
    history_completed: u64,
    history_dead: u64,
    drain_with_history_tasks_per_s: Option<f64>,
    history_ratio: Option<f64>,
    /// Cleanup of a day of completed tasks past the retention.
    retention: Option<retention::RetentionReport>,
    /// The long drain (`--long-drain` tasks, history kept).
    long_drain_tasks: usize,
    long_drain_tasks_per_s: Option<f64>,
    /// Its rate over the main drain's.
    long_drain_ratio: Option<f64>,
    long_drain_peak_rss_mb: Option<f64>,
    /// The drain beside a held snapshot (`--held-snapshot-tasks`).
    held_snapshot: Option<HeldSnapshot>,
    /// The operator views' query times with the history in the table.
    operator_views: Option<operator_views::OperatorViews>,
    /// What each peer printed, run on the same database in the same run.
    peers: Vec<serde_json::Value>,
    /// The fastest peer's burn-down.
    best_peer_drain_jobs_per_s: Option<f64>,
    /// Our history-kept burn-down over the fastest peer's.
    ratio_vs_best_peer: Option<f64>,
    /// Our delete-mode burn-down over the fastest peer's.
    delete_mode_ratio_vs_best_peer: Option<f64>,
    /// Ordering keys: drains and claim times.
    ordering: Option<ordering::OrderingReport>,
    /// Workflows: a step's cost against a plain task, a wide fan-in.
    workflows: Option<workflows::WorkflowReport>,
    /// The application's transaction with and without a submit.
    business_transaction: Option<business::BusinessReport>,
    /// `--relay`: events/s and commit-to-ack (the other phases are skipped).
    relay: Option<relay::RelayReport>,
}

#[derive(Debug, Serialize)]
struct Latency {
    samples: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

impl Latency {
    fn of(mut ms: Vec<f64>) -> Self {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() as f64 * q) as usize).min(ms.len() - 1)];
        Self {
            samples: ms.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: ms[ms.len() - 1],
        }
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            self.p50, self.p99, self.max
        )
    }
}

/// The drain beside a held snapshot (`--held-snapshot-tasks`).
#[derive(Debug, Serialize)]
struct HeldSnapshot {
    /// Tasks of each drain.
    tasks: usize,
    /// The drain with nothing else open.
    tasks_per_s: f64,
    /// The same drain while another session's snapshot stays open.
    with_snapshot_held_tasks_per_s: f64,
    /// The second over the first: target 0.8 or more.
    ratio: f64,
    /// How long the snapshot was open.
    snapshot_held_seconds: f64,
    /// Drains of `tasks` with the snapshot open (and as many seconds'
    /// worth without it: `free_rounds`).
    rounds: usize,
    free_rounds: usize,
    /// The last held drain's rate over the last free drain's: how the
    /// ratio stands at the end, when the snapshot is oldest.
    last_round_ratio: f64,
}

/// Drains of the same size, one after the other.
struct Rounds {
    rounds: usize,
    tasks: usize,
    /// Time spent draining (not inserting).
    seconds: f64,
    last_rate: f64,
}

impl Rounds {
    fn rate(&self) -> f64 {
        self.tasks as f64 / self.seconds.max(1e-9)
    }
}

/// The running benchmark: where the database is and what it measured.
struct Bench {
    args: BenchArgs,
    url: String,
    pool: PgPool,
    register: Register,
    report: Report,
}

/// Runs the bench until it ends or a SIGINT or SIGTERM. A signal drops the
/// run where it is, and with it the brokers it started; the private
/// PostgreSQL, owned here, is stopped after it (each server runs in its
/// own process group, so the terminal's Ctrl-C never reaches it). The
/// handlers are in place before the server starts, and a signal while it
/// starts is acted on once it is up: the start is not cut short, so the
/// server is never left without an owner.
pub(crate) async fn run(args: BenchArgs, register: Register) -> Result<(), Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = (
        signal(SignalKind::terminate()).map_err(Failure::runtime)?,
        signal(SignalKind::interrupt()).map_err(Failure::runtime)?,
    );
    if args.metrics {
        // Recorded and never scraped: the cost is the recording.
        crate::metrics::install().map_err(Failure::runtime)?;
    }
    let options = LocalPostgresOptions {
        durable: true,
        max_connections: 200,
        extra_settings: if args.statements {
            vec!["shared_preload_libraries = 'pg_stat_statements'".to_owned()]
        } else {
            Vec::new()
        },
    };
    let (url, cluster) = database_or_private(args.database_url.clone(), options).await?;
    let result = tokio::select! {
        result = run_to_the_end(args, register, url) => result,
        _ = term.recv() => Err(interrupted()),
        _ = int.recv() => Err(interrupted()),
    };
    // Another signal now is ignored: the handlers stay ours until exit.
    drop(cluster);
    result
}

fn interrupted() -> Failure {
    Failure::runtime("interrupted: the bench stopped, and so did the servers it started")
}

async fn run_to_the_end(args: BenchArgs, register: Register, url: String) -> Result<(), Failure> {
    let pool = connect_bench(&url, args.submitters.max(4) as u32 + 2).await?;
    outbox::migrate(&pool).await?;
    // Today's history partitions, as a maintenance leader makes them: a
    // scratch database may have had no worker for days, and the latency
    // phase's worker runs without maintenance.
    outbox::maintenance::prepare_history(
        &mut *pool.acquire().await.map_err(db)?,
        Duration::from_secs(86_400),
        &outbox::Clock::database(),
    )
    .await?;
    let report = Report {
        postgres: sqlx::query_scalar("SHOW server_version")
            .fetch_one(&pool)
            .await
            .map_err(db)?,
        tasks: args.tasks,
        concurrency: args.concurrency,
        claim_ahead: args.claim_ahead,
        claim_ahead_window_ms: args.claim_ahead_window.as_secs_f64() * 1000.0,
        key_run: args.key_run,
        insert_batch: args.insert_batch,
        single_submit_clients: args.submitters,
        single_submits: args.single_submits,
        history_completed: args.history_completed,
        history_dead: args.history_dead,
        ..Report::default()
    };
    if args.statements {
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&pool)
            .await
            .map_err(db)?;
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(&pool)
            .await
            .map_err(db)?;
    }
    let mut bench = Bench {
        args,
        url,
        pool,
        register,
        report,
    };
    bench.reset().await?;
    bench.run_phases().await?;
    if bench.args.statements {
        bench.print_statements().await?;
    }
    bench.reset().await?;
    bench.pool.close().await;
    if bench.args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&bench.report).map_err(Failure::runtime)?
        );
    }
    Ok(())
}

impl Bench {
    fn say(&self, line: impl std::fmt::Display) {
        if !self.args.json {
            println!("{line}");
        }
    }

    async fn run_phases(&mut self) -> Result<(), Failure> {
        if let Some(kind) = self.args.relay.relay {
            // Boxed: the relay phases' future is large, and `run`'s holds it.
            self.report.relay = Some(Box::pin(relay::measure(self, kind)).await?);
            return Ok(());
        }
        if self.args.single_submits > 0 {
            let clients = self.args.submitters;
            let [tx, autocommit, floor] = self.single_submits().await?;
            self.report.single_submit_tx_per_s = Some(tx);
            self.report.single_submit_autocommit_per_s = Some(autocommit);
            self.report.single_submit_floor_per_s = Some(floor);
            self.say(format!(
                "submit from {clients} clients: BEGIN; submit; COMMIT {tx:.0} tasks/s; one autocommit \
                 submit per task {autocommit:.0} tasks/s\n  floor, one autocommit INSERT of an order row \
                 per statement: {floor:.0} rows/s (submit / floor: {:.2}x)",
                autocommit / floor.max(1e-9)
            ));
        }
        self.report.business_transaction = business::measure(self).await?;

        let (n, batch) = (self.args.tasks, self.args.insert_batch);
        self.report.insert_tasks_per_s = self.insert(n).await?;
        self.say(format!(
            "insert: {n} tasks in batches of {batch}: {:.0} tasks/s",
            self.report.insert_tasks_per_s
        ));

        let drain = self.drain(false).await?;
        self.report.drain_tasks_per_s = drain.rate;
        self.report.drain_seconds = drain.seconds;
        self.report.round_trips_per_task = drain.counters.round_trips() as f64 / n.max(1) as f64;
        self.report.claim_queries = drain.counters.claim_queries;
        self.report.finish_queries = drain.counters.finish_queries;
        self.report.heartbeat_queries = drain.counters.heartbeat_queries;
        self.report.peak_rss_mb = peak_rss_mb();
        self.say(format!(
            "drain, history kept: {n} tasks, concurrency {}: {:.0} tasks/s ({:.2} s), {:.3} round trips per task, \
             peak RSS {:.0} MB",
            self.args.concurrency,
            drain.rate,
            drain.seconds,
            self.report.round_trips_per_task,
            self.report.peak_rss_mb.unwrap_or(0.0)
        ));

        if self.args.long_drain > 0 {
            let long = self.args.long_drain;
            self.insert(long).await?;
            let drained = self.drain_count(false, long).await?;
            let ratio = drained.rate / drain.rate.max(1e-9);
            self.report.long_drain_tasks = long;
            self.report.long_drain_tasks_per_s = Some(drained.rate);
            self.report.long_drain_ratio = Some(ratio);
            self.report.long_drain_peak_rss_mb = peak_rss_mb();
            self.say(format!(
                "long drain, history kept: {long} tasks: {:.0} tasks/s, {ratio:.2}x the main drain, \
                 peak RSS {:.0} MB",
                drained.rate,
                self.report.long_drain_peak_rss_mb.unwrap_or(0.0)
            ));
        }

        if self.args.held_snapshot_tasks > 0 {
            self.report.held_snapshot = Some(self.held_snapshot().await?);
        }

        if self.args.delete_mode {
            self.insert(n).await?;
            let deleting = self.drain(true).await?;
            self.report.drain_delete_mode_tasks_per_s = Some(deleting.rate);
            self.say(format!(
                "drain, successful tasks deleted at once (retention 0): {:.0} tasks/s ({:.2} s)",
                deleting.rate, deleting.seconds
            ));
        }

        if self.args.ordering.ordered_keys > 0 {
            let figures = ordering::measure(self, drain.rate).await?;
            self.report.ordering = Some(figures);
        }

        if self.args.workflows.workflow_steps > 0 || self.args.workflows.fan_in > 0 {
            let figures = workflows::measure(self, drain.rate).await?;
            self.report.workflows = Some(figures);
        }

        for command in self.args.peer_command.clone() {
            let command = command
                .replace("{tasks}", &n.to_string())
                .replace("{concurrency}", &self.args.concurrency.to_string());
            let peer = self.run_peer(&command).await?;
            let peer_rate = peer["drain_jobs_per_s"].as_f64().unwrap_or(0.0).max(1e-9);
            self.say(format!(
                "peer: {peer}\n  ours / peer: {:.2}x (history kept), {} (deleted at once)",
                drain.rate / peer_rate,
                self.report
                    .drain_delete_mode_tasks_per_s
                    .map_or("-".to_owned(), |r| format!("{:.2}x", r / peer_rate))
            ));
            self.report.peers.push(peer);
            if self
                .report
                .best_peer_drain_jobs_per_s
                .is_none_or(|best| peer_rate > best)
            {
                self.report.best_peer_drain_jobs_per_s = Some(peer_rate);
                self.report.ratio_vs_best_peer = Some(drain.rate / peer_rate);
                self.report.delete_mode_ratio_vs_best_peer = self
                    .report
                    .drain_delete_mode_tasks_per_s
                    .map(|rate| rate / peer_rate);
            }
        }
        if let Some(ratio) = self.report.ratio_vs_best_peer
            && self.report.peers.len() > 1
        {
            self.say(format!("ours / fastest peer: {ratio:.2}x (history kept)"));
        }

        if self.args.latency_samples > 0 {
            // An idle queue on an idle server: flush what the phases before
            // wrote (a checkpoint they started would stall the probes' own
            // commits for tens of milliseconds). Best effort: it needs a
            // superuser or pg_checkpoint, as on the private cluster.
            self.checkpoint().await;
            let (from_submit, from_commit) = self.pickup_latency().await?;
            self.say(format!(
                "pickup latency, idle queue, {} samples: {from_submit}",
                from_submit.samples
            ));
            self.say(format!("  counted from the submit's commit: {from_commit}"));
            self.report.pickup_latency_ms = Some(from_submit);
            self.report.pickup_after_commit_ms = Some(from_commit);
        }

        let (completed, dead) = (self.args.history_completed, self.args.history_dead);
        if completed + dead > 0 {
            self.reset().await?;
            let filled: i64 = sqlx::query_scalar(include_str!("sql/prefill_history.sql"))
                .bind(completed as i64)
                .bind(dead as i64)
                .fetch_one(&self.pool)
                .await
                .map_err(db)?;
            self.vacuum().await?;
            self.say(format!(
                "history: {filled} rows pre-filled ({completed} completed, {dead} dead)"
            ));
            self.insert(n).await?;
            let views = operator_views::measure(&self.pool).await?;
            self.say(format!(
                "operator views with the history and {n} pending tasks: overview {}\n  tasks, first page: {}\n  completed, page 20: {}\n  dead, first page: {}",
                views.overview_ms, views.tasks_first_page_ms, views.completed_page_20_ms, views.dead_page_ms
            ));
            self.report.operator_views = Some(views);
            let with_history = self.drain(false).await?;
            let ratio = with_history.rate / drain.rate.max(1e-9);
            self.report.drain_with_history_tasks_per_s = Some(with_history.rate);
            self.report.history_ratio = Some(ratio);
            self.say(format!(
                "drain with history: {:.0} tasks/s, {ratio:.2}x the empty-table figure",
                with_history.rate
            ));
        }

        // Last: its million-row insert leaves checkpoint work that would
        // disturb the latency and drain phases.
        if self.args.retention_rows > 0 {
            let figures = retention::measure(self, self.args.retention_rows).await?;
            self.say(format!(
                "retention: a day of {} completed tasks past it, removed in {:.3} s \
                 ({} partitions dropped, {} rows deleted one by one)",
                self.args.retention_rows,
                figures.seconds,
                figures.partitions_dropped,
                figures.rows_deleted
            ));
            self.report.retention = Some(figures);
        }
        Ok(())
    }

    /// Runs the peer's burn-down against this database; its JSON line.
    async fn run_peer(&self, command: &str) -> Result<serde_json::Value, Failure> {
        let output = tokio::process::Command::new("sh")
            .args(["-c", command])
            .env("DATABASE_URL", &self.url)
            .stderr(std::process::Stdio::inherit())
            .output()
            .await
            .map_err(|e| Failure::runtime(format!("cannot run the peer: {e}")))?;
        if !output.status.success() {
            return Err(Failure::runtime(format!(
                "the peer failed: {}",
                output.status
            )));
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .unwrap_or("");
        serde_json::from_str(line)
            .map_err(|e| Failure::runtime(format!("the peer printed no JSON line: {e}\n{stdout}")))
    }

    /// The statements that took the most database time, from
    /// pg_stat_statements.
    async fn print_statements(&self) -> Result<(), Failure> {
        let rows: Vec<(String, i64, f64, f64, i64)> =
            sqlx::query_as(include_str!("sql/top_statements.sql"))
                .fetch_all(&self.pool)
                .await
                .map_err(db)?;
        eprintln!(
            "{:>10} {:>10} {:>9} {:>10}  statement",
            "calls", "total ms", "mean ms", "rows"
        );
        for (query, calls, total, mean, rows) in rows {
            let query: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
            let shown: String = query.chars().take(110).collect();
            eprintln!("{calls:>10} {total:>10.0} {mean:>9.3} {rows:>10}  {shown}");
        }
        Ok(())
    }

    /// Flushes what earlier phases wrote, so a checkpoint they started does
    /// not stall a latency phase's commits. Best effort: it needs a
    /// superuser or pg_checkpoint, as on the private cluster.
    async fn checkpoint(&self) {
        if let Err(error) = sqlx::query("CHECKPOINT").execute(&self.pool).await {
            tracing::debug!(%error, "no checkpoint before the latency phase");
        }
    }

    async fn reset(&self) -> Result<(), Failure> {
        sqlx::raw_sql(include_str!("sql/reset.sql"))
            .execute(&self.pool)
            .await
            .map_err(db)?;
        self.vacuum().await
    }

    async fn vacuum(&self) -> Result<(), Failure> {
        // One statement each: VACUUM refuses to run in the implicit
        // transaction of a multi-statement query.
        for table in [
            "VACUUM ANALYZE outbox_tasks",
            "VACUUM ANALYZE outbox_task_history",
            "VACUUM ANALYZE outbox_intake",
        ] {
            sqlx::query(table).execute(&self.pool).await.map_err(db)?;
        }
        Ok(())
    }

    /// Inserts `n` no-op tasks in transactions of `insert_batch`; tasks/s.
    async fn insert(&self, n: usize) -> Result<f64, Failure> {
        self.insert_keyed(n, |_| None).await
    }

    /// Inserts `n` no-op tasks, task `i` with ordering key `key(i)`, in
    /// transactions of `insert_batch`; tasks/s.
    async fn insert_keyed(
        &self,
        n: usize,
        key: impl Fn(usize) -> Option<String>,
    ) -> Result<f64, Failure> {
        let started = Instant::now();
        let mut left = n;
        let mut i = 0;
        while left > 0 {
            let size = left.min(self.args.insert_batch.max(1));
            let mut batch = Batch::new();
            for _ in 0..size {
                let mut options = TaskOptions::new().queue(QUEUE);
                if let Some(k) = key(i) {
                    options = options.ordering_key(k);
                }
                batch.push_with(&Noop {}, options)?;
                i += 1;
            }
            let mut tx = self.pool.begin().await.map_err(db)?;
            batch.submit(&mut tx).await?;
            tx.commit().await.map_err(db)?;
            left -= size;
        }
        Ok(n as f64 / started.elapsed().as_secs_f64())
    }

    /// The submitters send `single_submits` tasks, one per transaction, in
    /// three ways: BEGIN; submit; COMMIT, one autocommit submit statement,
    /// and (the floor) one autocommit INSERT of an order row. The three
    /// alternate in rounds so that a slow spell of the machine falls on all
    /// alike; per second, in that order. Everything written is removed.
    async fn single_submits(&self) -> Result<[f64; 3], Failure> {
        const ROUNDS: usize = 4;
        // The three ways, as indexes of the result; anything else is the floor.
        const IN_TRANSACTION: usize = 0;
        const AUTOCOMMIT: usize = 1;
        let (clients, total) = (self.args.submitters.max(1), self.args.single_submits);
        sqlx::raw_sql(business::CREATE_ORDERS)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        let mut seconds = [0.0; 3];
        let mut done = [0usize; 3];
        for round in 0..ROUNDS {
            let count = total / ROUNDS + usize::from(round < total % ROUNDS);
            for k in 0..3 {
                let way = (round + k) % 3;
                let started = Instant::now();
                let mut handles = Vec::new();
                for c in 0..clients {
                    let pool = self.pool.clone();
                    let share = count / clients + usize::from(c < count % clients);
                    handles.push(tokio::spawn(async move {
                        let options = || TaskOptions::new().queue(SUBMIT_QUEUE);
                        let mut conn = pool.acquire().await?;
                        for i in 0..share {
                            match way {
                                IN_TRANSACTION => {
                                    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                                    outbox::submit_with(&mut tx, Noop {}, options()).await?;
                                    tx.commit().await?;
                                }
                                AUTOCOMMIT => {
                                    outbox::submit_with(&mut conn, Noop {}, options()).await?;
                                }
                                _ => drop(business::insert_order(&mut conn, i as i64).await?),
                            }
                        }
                        Ok::<_, outbox::Error>(())
                    }));
                }
                for h in handles {
                    h.await.map_err(Failure::runtime)??;
                }
                seconds[way] += started.elapsed().as_secs_f64();
                done[way] += count;
            }
        }
        sqlx::raw_sql("DROP TABLE bench_orders")
            .execute(&self.pool)
            .await
            .map_err(db)?;
        self.reset().await?;
        Ok([0, 1, 2].map(|w| done[w] as f64 / seconds[w].max(1e-9)))
    }

    /// Runs a worker until `tasks` outcomes are committed.
    async fn drain(&self, delete: bool) -> Result<Drain, Failure> {
        self.drain_count(delete, self.args.tasks).await
    }

    /// Runs a worker until `count` outcomes are committed.
    async fn drain_count(&self, delete: bool, count: usize) -> Result<Drain, Failure> {
        let pool =
            connect_bench(&self.url, (self.args.concurrency / 4).clamp(4, 16) as u32).await?;
        // Maintenance on, as in a worker of `run`: its leader vacuums the
        // task table as a drain goes.
        let config = WorkerConfig {
            delete_completed: delete,
            claim_ahead: self.args.claim_ahead,
            claim_ahead_window: self.args.claim_ahead_window,
            key_run: self.args.key_run,
            ..WorkerConfig::default()
        };
        let (probes, _) = mpsc::unbounded_channel();
        let builder = Worker::builder(pool.clone())
            .config(config)
            .handler::<Noop>(Builtins)
            .handler::<Probe>(ProbeHandler(probes));
        let worker = (self.register)(builder)
            .queue(QUEUE, self.args.concurrency)
            .build()?;
        let counters = worker.counters();
        let mut events = worker.subscribe();
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let running = tokio::spawn(worker.run(shutdown.clone()));
        let mut done = 0;
        let mut first = None;
        while done < count {
            match tokio::time::timeout(Duration::from_secs(120), events.recv()).await {
                Ok(Ok(e)) if e.kind == TaskEventKind::Completed => done += 1,
                Ok(Ok(_)) => {}
                Ok(Err(RecvError::Lagged(n))) => done += n as usize,
                Ok(Err(RecvError::Closed)) | Err(_) => {
                    return Err(Failure::runtime(format!(
                        "drain stalled at {done} of {count}"
                    )));
                }
            }
            if done > 0 && first.is_none() {
                first = Some(Instant::now());
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let after_first = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let counters = counters.snapshot();
        shutdown.cancel();
        running.await.map_err(Failure::runtime)??;
        pool.close().await;
        self.reset().await?;
        Ok(Drain {
            rate: count as f64 / seconds,
            seconds,
            after_first,
            counters,
        })
    }

    /// `--held-snapshot-tasks`: the same drain without and with another
    /// session's snapshot held open from before the drain's first claim to
    /// after its last outcome (a long report query, a stuck `pg_dump`).
    async fn held_snapshot(&self) -> Result<HeldSnapshot, Failure> {
        let tasks = self.args.held_snapshot_tasks;
        let hold = Duration::from_secs(self.args.held_snapshot_seconds);
        let (free, held, held_seconds) = without_and_with_a_held_snapshot(
            &self.pool,
            "SELECT count(*) FROM outbox_tasks",
            async || self.drain_rounds(tasks, hold).await,
        )
        .await?;
        let report = HeldSnapshot {
            tasks,
            tasks_per_s: free.rate(),
            with_snapshot_held_tasks_per_s: held.rate(),
            ratio: held.rate() / free.rate().max(1e-9),
            snapshot_held_seconds: held_seconds,
            rounds: held.rounds,
            free_rounds: free.rounds,
            last_round_ratio: held.last_rate / free.last_rate.max(1e-9),
        };
        self.say(format!(
            "drain beside a snapshot held open, history kept, drains of {tasks} tasks: {:.0} tasks/s \
             over {} with the snapshot held {:.1} s, against {:.0} over {} without it ({:.2}x; \
             the last drain {:.2}x)",
            report.with_snapshot_held_tasks_per_s,
            report.rounds,
            held_seconds,
            report.tasks_per_s,
            report.free_rounds,
            report.ratio,
            report.last_round_ratio,
        ));
        Ok(report)
    }

    /// Inserts `tasks` and drains them, again and again until `at_least`
    /// has passed (once at least).
    async fn drain_rounds(&self, tasks: usize, at_least: Duration) -> Result<Rounds, Failure> {
        let started = Instant::now();
        let mut rounds = Rounds {
            rounds: 0,
            tasks: 0,
            seconds: 0.0,
            last_rate: 0.0,
        };
        while rounds.rounds == 0 || started.elapsed() < at_least {
            self.insert(tasks).await?;
            let drained = self.drain_count(false, tasks).await?;
            rounds.rounds += 1;
            rounds.tasks += tasks;
            rounds.seconds += drained.seconds;
            rounds.last_rate = drained.rate;
        }
        Ok(rounds)
    }

    /// Submits one probe at a time to an idle worker and times it to the
    /// handler's start, from the submit call and from its commit.
    async fn pickup_latency(&self) -> Result<(Latency, Latency), Failure> {
        let worker_pool = connect_bench(&self.url, 4).await?;
        let (probe_tx, mut probe_rx) = mpsc::unbounded_channel();
        let worker = (self.register)(
            Worker::builder(worker_pool.clone())
                .config(WorkerConfig {
                    maintenance: false,
                    ..WorkerConfig::default()
                })
                .handler::<Probe>(ProbeHandler(probe_tx)),
        )
        .queue(QUEUE, 4)
        .build()?;
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(worker.run(shutdown.clone()));
        let mut conn = self.pool.acquire().await.map_err(db)?;
        let (mut from_submit, mut from_commit) = (Vec::new(), Vec::new());
        // The first few also wait for the worker's LISTEN connection.
        for i in 0..self.args.latency_samples + 20 {
            let sent = Instant::now();
            outbox::submit(&mut conn, Probe {}).await?;
            let committed = Instant::now();
            let started = tokio::time::timeout(Duration::from_secs(10), probe_rx.recv())
                .await
                .map_err(|_| Failure::runtime("a probe was not picked up within 10 s"))?
                .ok_or_else(|| Failure::runtime("the probe handler is gone"))?;
            if i >= 20 {
                from_submit.push(started.duration_since(sent).as_secs_f64() * 1000.0);
                from_commit
                    .push(started.saturating_duration_since(committed).as_secs_f64() * 1000.0);
            }
            // Let the queue go quiet again (past the busy poll and the
            // NOTIFY debounce window), as an idle queue is.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shutdown.cancel();
        running.await.map_err(Failure::runtime)??;
        worker_pool.close().await;
        self.reset().await?;
        Ok((Latency::of(from_submit), Latency::of(from_commit)))
    }
}

/// The queue of the single-submit phase.
const SUBMIT_QUEUE: &str = "outbox-bench-submit";

struct Drain {
    rate: f64,
    seconds: f64,
    /// From the first outcome to the last: the drain without its worker's
    /// start and first claim (for comparing drains of a few seconds).
    after_first: f64,
    counters: outbox::CountersSnapshot,
}

/// Runs `work` once, then again while another session holds a REPEATABLE
/// READ snapshot, taken by the statement `take` (a long report query, a
/// stuck `pg_dump`): both results, and how long the snapshot was held.
async fn without_and_with_a_held_snapshot<T>(
    pool: &PgPool,
    take: &'static str,
    mut work: impl AsyncFnMut() -> Result<T, Failure>,
) -> Result<(T, T, f64), Failure> {
    let free = work().await?;
    let mut holder = pool.begin().await.map_err(db)?;
    for sql in ["SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", take] {
        sqlx::raw_sql(sql).execute(&mut *holder).await.map_err(db)?;
    }
    let held_since = Instant::now();
    let held = work().await;
    let held_seconds = held_since.elapsed().as_secs_f64();
    let rolled_back = holder.rollback().await;
    let held = held?;
    rolled_back.map_err(db)?;
    Ok((free, held, held_seconds))
}

fn db(e: sqlx::Error) -> Failure {
    Failure::from(outbox::Error::from(e))
}

/// The CPU time a process has used (user and system, all its threads, and
/// its children once it has reaped them: Redis's rewrite of its log runs
/// in a child), in seconds: this process's with `None`. From /proc, where
/// it exists; its clock ticks are USER_HZ, 100 a second on Linux.
pub(crate) fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields 14 to 17 (utime, stime, cutime, cstime); the name before them
    // is in parentheses and may hold spaces, so count from its closing one
    // (field 3 comes next).
    let ticks = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|t| t.parse::<f64>().ok())
        .sum::<Option<f64>>()?;
    Some(ticks / 100.0)
}

/// The whole machine's CPU time since boot, from /proc/stat's first line:
/// (busy, all) in seconds over every core. Busy is user, nice, system, irq
/// and softirq time; all adds idle, iowait and steal (time the hypervisor
/// gave to another guest, which this machine's processes could not use).
pub(crate) fn machine_cpu_seconds() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<f64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .take(8)
        .map(|t| t.parse::<f64>().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = fields[..] else {
        return None;
    };
    let busy = user + nice + system + irq + softirq;
    Some((busy / 100.0, (busy + idle + iowait + steal) / 100.0))
}

/// The machine's cores, as /proc/stat counts them (the busy share of
/// [`machine_cpu_seconds`] is over these, whatever this process may use),
/// else as the process sees them.
pub(crate) fn machine_cores() -> usize {
    let listed = std::fs::read_to_string("/proc/stat").ok().map(|stat| {
        stat.lines()
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .count()
    });
    match listed {
        Some(n) if n > 0 => n,
        _ => std::thread::available_parallelism().map_or(1, usize::from),
    }
}

/// This process's peak resident memory (VmHWM), in MB, where /proc has it.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
