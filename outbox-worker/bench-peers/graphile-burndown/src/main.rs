//! Burn-down benchmark for graphile_worker 0.14.1.
//!
//! Inserts N no-op jobs with `WorkerUtils::add_jobs` (batches of 5,000), then
//! runs one worker with concurrency C, LocalQueue size 500 and 1 ms completion
//! batching, and times until no job of this harness is left in
//! `graphile_worker._private_jobs` (graphile_worker deletes a job row when it
//! completes): a COUNT polled every 10 ms once the handler has run N times
//! (once a second before that, when it cannot be 0 yet). Prints one JSON line
//! on stdout; logs go to stderr.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use graphile_worker::{
    IntoTaskHandlerResult, JobSpec, LocalQueueConfig, TaskHandler, WorkerContext, WorkerOptions,
};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

const NAME: &str = "graphile_worker 0.14.1";
const SCHEMA: &str = "graphile_worker";
const TASK: &str = "burndown_noop";
const INSERT_BATCH: usize = 5_000;
const LOCAL_QUEUE_SIZE: usize = 500;
const COMPLETE_BATCH_DELAY: Duration = Duration::from_millis(1);
const POLL_EVERY: Duration = Duration::from_millis(10);
const SLOW_POLL_EVERY: Duration = Duration::from_secs(1);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1800);

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct BurndownNoop {}

#[derive(Clone, Debug)]
struct Ran(Arc<AtomicU64>);

impl TaskHandler for BurndownNoop {
    const IDENTIFIER: &'static str = TASK;

    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        if let Some(ran) = ctx.get_ext::<Ran>() {
            ran.0.fetch_add(1, Ordering::Relaxed);
        }
        Ok::<(), String>(())
    }
}

struct Args {
    jobs: usize,
    concurrency: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { jobs: 200_000, concurrency: 24 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let (key, inline) = match flag.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (flag.clone(), None),
        };
        let mut value = || -> Result<usize, String> {
            let v = match inline.clone() {
                Some(v) => v,
                None => it.next().ok_or_else(|| format!("{key} needs a value"))?,
            };
            v.parse::<usize>().map_err(|e| format!("bad value for {key}: {v} ({e})"))
        };
        match key.as_str() {
            "--jobs" => args.jobs = value()?,
            "--concurrency" => args.concurrency = value()?,
            "-h" | "--help" => {
                eprintln!("usage: graphile-burndown [--jobs N (200000)] [--concurrency C (24)]\nenv: DATABASE_URL");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument: {other}")),
        }
    }
    if args.jobs == 0 || args.concurrency == 0 {
        return Err("--jobs and --concurrency must be > 0".into());
    }
    Ok(args)
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sqlx::query=error")),
        )
        .init();
    if let Err(e) = run().await {
        eprintln!("graphile-burndown: error: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set")?;
    let (n, c) = (args.jobs, args.concurrency);

    let ran = Arc::new(AtomicU64::new(0));
    // init() connects (library default pool, max_pg_conn = 20) and runs the
    // library's own (idempotent) migrations into schema `graphile_worker`.
    let worker = WorkerOptions::default()
        .database_url(&url)
        .max_pg_conn(20)
        .schema(SCHEMA)
        .concurrency(c)
        .local_queue(LocalQueueConfig::default().with_size(LOCAL_QUEUE_SIZE))
        .complete_job_batch_delay(COMPLETE_BATCH_DELAY)
        .add_extension(Ran(ran.clone()))
        .define_job::<BurndownNoop>()
        .init()
        .await?;
    let worker = Arc::new(worker);
    eprintln!("[graphile] migrated; schema={SCHEMA} jobs={n} concurrency={c} local_queue={LOCAL_QUEUE_SIZE} complete_batch_delay=1ms");

    // Separate one-connection pool for cleanup and the COUNT poll, so the
    // poll never competes with the worker's own pool.
    let probe = PgPoolOptions::new().max_connections(1).connect(&url).await?;
    // SCHEMA is `graphile_worker`; these literals must match it.
    let count_sql = "SELECT count(*)::bigint FROM graphile_worker._private_jobs \
         WHERE task_id = (SELECT id FROM graphile_worker._private_tasks WHERE identifier = $1)";
    let delete_sql = "DELETE FROM graphile_worker._private_jobs \
         WHERE task_id = (SELECT id FROM graphile_worker._private_tasks WHERE identifier = $1)";
    let left = sqlx::query(delete_sql).bind(TASK).execute(&probe).await?.rows_affected();
    if left > 0 {
        eprintln!("[graphile] removed {left} leftover {TASK} jobs");
    }

    // Insert with the batch API, 5,000 per call.
    let utils = worker.create_utils();
    let spec = JobSpec::default();
    let t0 = Instant::now();
    let mut inserted = 0usize;
    while inserted < n {
        let k = INSERT_BATCH.min(n - inserted);
        let batch: Vec<(BurndownNoop, &JobSpec)> = (0..k).map(|_| (BurndownNoop {}, &spec)).collect();
        let added = utils.add_jobs::<BurndownNoop>(&batch).await?;
        inserted += added.len();
    }
    let insert_s = t0.elapsed().as_secs_f64();
    let queued: i64 = sqlx::query_scalar(count_sql).bind(TASK).fetch_one(&probe).await?;
    if queued != n as i64 {
        return Err(format!("expected {n} queued jobs after insert, found {queued}").into());
    }
    eprintln!("[graphile] inserted {n} in {insert_s:.3}s ({:.0}/s)", n as f64 / insert_s);

    // Drain.
    let t1 = Instant::now();
    let w = worker.clone();
    let handle = tokio::spawn(async move { w.run().await });
    let mut polls = 0u64;
    let mut poll_time = Duration::ZERO;
    let mut last_poll = Instant::now();
    loop {
        tokio::time::sleep(POLL_EVERY).await;
        // The COUNT cannot reach 0 before the handler has run N times, so
        // until then poll only once a second: a 200k-row COUNT every 10 ms
        // would take one PostgreSQL backend away from the worker being timed.
        if ran.load(Ordering::Relaxed) < n as u64 && last_poll.elapsed() < SLOW_POLL_EVERY {
            continue;
        }
        last_poll = Instant::now();
        let p = Instant::now();
        let remaining: i64 = sqlx::query_scalar(count_sql).bind(TASK).fetch_one(&probe).await?;
        poll_time += p.elapsed();
        polls += 1;
        if remaining == 0 {
            break;
        }
        if handle.is_finished() {
            return Err(format!("worker stopped with {remaining} jobs left").into());
        }
        if t1.elapsed() > DRAIN_TIMEOUT {
            return Err(format!("timeout: {remaining} jobs left").into());
        }
    }
    let drain_s = t1.elapsed().as_secs_f64();
    eprintln!(
        "[graphile] drained {n} in {drain_s:.3}s ({:.0}/s); handler ran {} times; {polls} polls, mean poll {:.2} ms",
        n as f64 / drain_s,
        ran.load(Ordering::Relaxed),
        poll_time.as_secs_f64() * 1000.0 / polls.max(1) as f64
    );

    worker.request_shutdown();
    match tokio::time::timeout(Duration::from_secs(30), handle).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => eprintln!("[graphile] worker returned error on shutdown: {e}"),
        Ok(Err(e)) => eprintln!("[graphile] worker task failed: {e}"),
        Err(_) => eprintln!("[graphile] worker did not stop within 30s"),
    }

    println!(
        "{}",
        serde_json::json!({
            "name": NAME,
            "drain_jobs_per_s": round1(n as f64 / drain_s),
            "insert_jobs_per_s": round1(n as f64 / insert_s),
            "jobs": n,
            "concurrency": c,
        })
    );
    Ok(())
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
