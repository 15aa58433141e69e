//! `outbox-worker bench`: a burn-down benchmark that prints numbers.
//!
//! Phases, each on the `outbox-bench` queue so a shared database's real
//! queues are left alone (still: point it at a scratch database):
//! 1. batch insert of N no-op tasks (rate);
//! 2. single-task transactional submits from several concurrent clients
//!    (rate), removed again before the drain;
//! 3. drain of the N tasks by one worker (committed completions per second,
//!    statements per task, peak resident memory);
//! 4. pickup latency on an idle queue (submit one task, time until its
//!    handler starts);
//! 5. with `--history-completed/--history-dead`: the same burn-down again
//!    with that much history in the table, and the ratio to step 3.
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
use sqlx::postgres::PgPoolOptions;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::builtin::{Builtins, Noop};
use crate::cli::{Failure, Register};
use crate::local_postgres::{LocalPostgres, LocalPostgresOptions};

/// The queue every benchmark task goes to.
const QUEUE: &str = "outbox-bench";

/// `bench`'s flags.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Use this (scratch) database instead of a private one.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Tasks in the burn-down.
    #[arg(long, default_value_t = 200_000)]
    tasks: usize,
    /// Worker concurrency during the drain.
    #[arg(long, default_value_t = 24)]
    concurrency: usize,
    /// Tasks per insert transaction.
    #[arg(long, default_value_t = 5000)]
    insert_batch: usize,
    /// Concurrent clients for the single-task submit phase.
    #[arg(long, default_value_t = 8)]
    submitters: usize,
    /// Single-task submits in that phase (0 skips it).
    #[arg(long, default_value_t = 40_000)]
    single_submits: usize,
    /// Pickup-latency samples (0 skips the phase).
    #[arg(long, default_value_t = 1000)]
    latency_samples: usize,
    /// COMPLETED rows to pre-fill for the history burn-down.
    #[arg(long, default_value_t = 0)]
    history_completed: u64,
    /// Dead rows to pre-fill for the history burn-down.
    #[arg(long, default_value_t = 0)]
    history_dead: u64,
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
    mode: &'static str,
    postgres: String,
    tasks: usize,
    concurrency: usize,
    insert_batch: usize,
    insert_tasks_per_s: f64,
    single_submit_clients: usize,
    single_submits: usize,
    single_submit_per_s: Option<f64>,
    drain_tasks_per_s: f64,
    drain_seconds: f64,
    round_trips_per_task: f64,
    claim_queries: u64,
    finish_queries: u64,
    heartbeat_queries: u64,
    peak_rss_mb: Option<f64>,
    pickup_latency_ms: Option<Latency>,
    history_completed: u64,
    history_dead: u64,
    drain_with_history_tasks_per_s: Option<f64>,
    history_ratio: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Latency {
    samples: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

pub(crate) async fn run(args: BenchArgs, register: Register) -> Result<(), Failure> {
    let (url, cluster) = match &args.database_url {
        Some(url) => (url.clone(), None),
        None => {
            let options = LocalPostgresOptions {
                durable: true,
                max_connections: 200,
            };
            let cluster = tokio::task::spawn_blocking(move || LocalPostgres::start(&options))
                .await
                .map_err(Failure::runtime)?
                .map_err(|e| Failure::runtime(format!("cannot start a private PostgreSQL: {e}")))?;
            (cluster.url("postgres"), Some(cluster))
        }
    };
    let pool = PgPoolOptions::new()
        .max_connections(args.submitters.max(4) as u32 + 2)
        // A health check per acquire is a round trip per statement; a broken
        // connection shows up as an error on use anyway.
        .test_before_acquire(false)
        .connect(&url)
        .await
        .map_err(|e| Failure::runtime(format!("cannot connect: {e}")))?;
    outbox::migrate(&pool).await?;
    reset(&pool).await?;
    let mut report = Report {
        mode: "history kept (COMPLETED rows stay until cleanup)",
        postgres: sqlx::query_scalar("SHOW server_version")
            .fetch_one(&pool)
            .await
            .map_err(db)?,
        tasks: args.tasks,
        concurrency: args.concurrency,
        insert_batch: args.insert_batch,
        single_submit_clients: args.submitters,
        single_submits: args.single_submits,
        history_completed: args.history_completed,
        history_dead: args.history_dead,
        ..Report::default()
    };
    let say = |line: String| {
        if !args.json {
            println!("{line}");
        }
    };

    report.insert_tasks_per_s = insert(&pool, args.tasks, args.insert_batch).await?;
    say(format!(
        "insert: {} tasks in batches of {}: {:.0} tasks/s",
        args.tasks, args.insert_batch, report.insert_tasks_per_s
    ));

    if args.single_submits > 0 {
        let rate = single_submits(&pool, args.submitters, args.single_submits).await?;
        report.single_submit_per_s = Some(rate);
        say(format!(
            "submit: single-task transactions, {} clients: {rate:.0} tasks/s",
            args.submitters
        ));
    }

    let drain = drain_once(&url, &args, register).await?;
    report.drain_tasks_per_s = drain.rate;
    report.drain_seconds = drain.seconds;
    report.round_trips_per_task = drain.round_trips as f64 / args.tasks.max(1) as f64;
    report.claim_queries = drain.counters.claim_queries;
    report.finish_queries = drain.counters.finish_queries;
    report.heartbeat_queries = drain.counters.heartbeat_queries;
    report.peak_rss_mb = peak_rss_mb();
    say(format!(
        "drain: {} tasks, concurrency {}: {:.0} tasks/s ({:.2} s), {:.3} round trips per task, peak RSS {:.0} MB",
        args.tasks,
        args.concurrency,
        drain.rate,
        drain.seconds,
        report.round_trips_per_task,
        report.peak_rss_mb.unwrap_or(0.0)
    ));

    if args.latency_samples > 0 {
        let latency = pickup_latency(&pool, &url, args.latency_samples, register).await?;
        say(format!(
            "pickup latency, idle queue, {} samples: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            latency.samples, latency.p50, latency.p99, latency.max
        ));
        report.pickup_latency_ms = Some(latency);
    }

    if args.history_completed + args.history_dead > 0 {
        reset(&pool).await?;
        let filled: i64 = sqlx::query_scalar(include_str!("sql/prefill_history.sql"))
            .bind(args.history_completed as i64)
            .bind(args.history_dead as i64)
            .fetch_one(&pool)
            .await
            .map_err(db)?;
        sqlx::query("VACUUM ANALYZE outbox_tasks")
            .execute(&pool)
            .await
            .map_err(db)?;
        say(format!(
            "history: {filled} rows pre-filled ({} completed, {} dead)",
            args.history_completed, args.history_dead
        ));
        insert(&pool, args.tasks, args.insert_batch).await?;
        let with_history = drain_once(&url, &args, register).await?;
        report.drain_with_history_tasks_per_s = Some(with_history.rate);
        report.history_ratio = Some(with_history.rate / drain.rate.max(1e-9));
        say(format!(
            "drain with history: {:.0} tasks/s, {:.2}x the empty-table figure",
            with_history.rate,
            with_history.rate / drain.rate.max(1e-9)
        ));
    }
    reset(&pool).await?;
    pool.close().await;
    drop(cluster);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(Failure::runtime)?
        );
    }
    Ok(())
}

fn db(e: sqlx::Error) -> Failure {
    Failure::from(outbox::Error::from(e))
}

async fn reset(pool: &PgPool) -> Result<(), Failure> {
    sqlx::query(include_str!("sql/reset.sql"))
        .execute(pool)
        .await
        .map_err(db)?;
    sqlx::query("VACUUM ANALYZE outbox_tasks")
        .execute(pool)
        .await
        .map_err(db)?;
    Ok(())
}

/// Inserts `n` no-op tasks in transactions of `batch`; returns tasks/s.
async fn insert(pool: &PgPool, n: usize, batch: usize) -> Result<f64, Failure> {
    let started = Instant::now();
    let mut left = n;
    while left > 0 {
        let size = left.min(batch.max(1));
        let mut b = Batch::new();
        for _ in 0..size {
            b.push_with(&Noop {}, TaskOptions::new().queue(QUEUE))?;
        }
        let mut tx = pool.begin().await.map_err(db)?;
        b.submit(&mut tx).await?;
        tx.commit().await.map_err(db)?;
        left -= size;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// `clients` concurrent clients submit `total` tasks, one per transaction;
/// returns tasks/s. The tasks are removed again afterwards.
async fn single_submits(pool: &PgPool, clients: usize, total: usize) -> Result<f64, Failure> {
    let clients = clients.max(1);
    let started = Instant::now();
    let mut handles = Vec::new();
    for c in 0..clients {
        let pool = pool.clone();
        let share = total / clients + usize::from(c < total % clients);
        handles.push(tokio::spawn(async move {
            for _ in 0..share {
                let mut tx = pool.begin().await?;
                outbox::submit_with(
                    &mut tx,
                    Noop {},
                    TaskOptions::new().queue("outbox-bench-submit"),
                )
                .await?;
                tx.commit().await?;
            }
            Ok::<_, outbox::Error>(())
        }));
    }
    for h in handles {
        h.await.map_err(Failure::runtime)??;
    }
    let rate = total as f64 / started.elapsed().as_secs_f64();
    sqlx::query("DELETE FROM outbox_tasks WHERE queue = 'outbox-bench-submit'")
        .execute(pool)
        .await
        .map_err(db)?;
    Ok(rate)
}

struct Drain {
    rate: f64,
    seconds: f64,
    round_trips: u64,
    counters: outbox::CountersSnapshot,
}

fn bench_worker(pool: PgPool, concurrency: usize, register: Register) -> Result<Worker, Failure> {
    let config = WorkerConfig {
        maintenance: false,
        ..WorkerConfig::default()
    };
    let builder = Worker::builder(pool)
        .config(config)
        .handler::<Noop>(Builtins);
    let (probe_tx, _) = mpsc::unbounded_channel();
    Ok(register(builder.handler::<Probe>(ProbeHandler(probe_tx)))
        .queue(QUEUE, concurrency)
        .build()?)
}

/// Runs a worker until every claimable bench task has a committed outcome.
async fn drain_once(url: &str, args: &BenchArgs, register: Register) -> Result<Drain, Failure> {
    let pool = worker_pool(url, args.concurrency).await?;
    let worker = bench_worker(pool.clone(), args.concurrency, register)?;
    let counters = worker.counters();
    let mut events = worker.subscribe();
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let mut done = 0;
    while done < args.tasks {
        match tokio::time::timeout(Duration::from_secs(120), events.recv()).await {
            Ok(Ok(e)) if e.kind == TaskEventKind::Completed => done += 1,
            Ok(Ok(_)) => {}
            Ok(Err(RecvError::Lagged(n))) => done += n as usize,
            Ok(Err(RecvError::Closed)) | Err(_) => {
                return Err(Failure::runtime(format!(
                    "drain stalled at {done} of {}",
                    args.tasks
                )));
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let snapshot = counters.snapshot();
    shutdown.cancel();
    running.await.map_err(Failure::runtime)??;
    pool.close().await;
    Ok(Drain {
        rate: args.tasks as f64 / seconds,
        seconds,
        round_trips: snapshot.round_trips(),
        counters: snapshot,
    })
}

async fn worker_pool(url: &str, concurrency: usize) -> Result<PgPool, Failure> {
    PgPoolOptions::new()
        .max_connections((concurrency / 4).clamp(4, 16) as u32)
        .test_before_acquire(false)
        .connect(url)
        .await
        .map_err(|e| Failure::runtime(format!("cannot connect: {e}")))
}

/// Submits one probe at a time to an idle worker and times submit-to-start.
async fn pickup_latency(
    pool: &PgPool,
    url: &str,
    samples: usize,
    register: Register,
) -> Result<Latency, Failure> {
    let worker_pool = worker_pool(url, 4).await?;
    let (probe_tx, mut probe_rx) = mpsc::unbounded_channel();
    let worker = register(
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
    let mut conn = pool.acquire().await.map_err(db)?;
    // Warm up: the first pickups also wait for the LISTEN connection.
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples + 20 {
        let sent = Instant::now();
        outbox::submit(&mut conn, Probe {}).await?;
        let started = tokio::time::timeout(Duration::from_secs(10), probe_rx.recv())
            .await
            .map_err(|_| Failure::runtime("a probe was not picked up within 10 s"))?
            .ok_or_else(|| Failure::runtime("the probe handler is gone"))?;
        if i >= 20 {
            latencies.push(started.duration_since(sent).as_secs_f64() * 1000.0);
        }
        // Let the worker go idle again, as in a quiet system.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    shutdown.cancel();
    running.await.map_err(Failure::runtime)??;
    worker_pool.close().await;
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Ok(Latency {
        samples,
        p50: at(0.50),
        p99: at(0.99),
        max: *latencies.last().unwrap_or(&0.0),
    })
}

/// This process's peak resident memory (VmHWM), in MB, where /proc has it.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
