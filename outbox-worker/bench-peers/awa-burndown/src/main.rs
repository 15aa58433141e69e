//! Burn-down benchmark for awa 0.6.9 (queue-storage engine, the 0.6 default).
//!
//! Inserts N no-op jobs with `QueueStorage::enqueue_params_copy` (the bulk
//! producer path awa recommends for queue storage) in batches of 5,000, then
//! starts one `Client` with a single queue of `max_workers = C` and times until
//! awa's terminal count for the queue has grown by N (awa keeps completed jobs
//! as terminal history; it does not delete them). The terminal count is the
//! `terminal` term of awa's own `QueueStorage::queue_counts` (same SQL, see
//! `TERMINAL_SQL`), polled every 10 ms once the handler has run N times (once
//! a second before that), and polled alone because the full exact `queue_counts` also
//! counts available/running rows and takes seconds per call on a 20k backlog.
//! After the drain (untimed) the full exact `queue_counts` is checked once.
//! Prints one JSON line on stdout; logs go to stderr.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use awa::{
    Client, InsertOpts, JobArgs, JobResult, QueueConfig, QueueStorage, QueueStorageConfig,
};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

const NAME: &str = "awa 0.6.9";
const QUEUE: &str = "burndown";
const INSERT_BATCH: usize = 5_000;
const POOL_SIZE: u32 = 20;
const POLL_INTERVAL: Duration = Duration::from_millis(50);
const ROTATE_INTERVAL: Duration = Duration::from_millis(1_000);
const POLL_EVERY: Duration = Duration::from_millis(10);
const SLOW_POLL_EVERY: Duration = Duration::from_secs(1);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1800);

/// The `terminal` column of awa 0.6.9 `QueueStorage::queue_counts_exact`
/// (awa-model/src/queue_storage.rs, `pruned_terminal` + counter-trusted
/// `live_terminal` CTEs) for schema `awa`: pruned rollups + folded live
/// counters + pending `done_entries` deltas + compact receipt completion
/// batches - receipt tombstones. Completed and failed both count as terminal.
const TERMINAL_SQL: &str = r#"
WITH pruned AS (
    SELECT COALESCE(sum(GREATEST(COALESCE(lanes.pruned_completed_count, 0),
                                 COALESCE(rollups.pruned_completed_count, 0))), 0)::bigint
         + COALESCE(sum(COALESCE(rollups.pruned_failed_count, 0)), 0)::bigint AS n
    FROM (SELECT queue, priority, pruned_completed_count
          FROM awa.queue_lanes WHERE queue = ANY($1)) AS lanes
    FULL OUTER JOIN (SELECT queue, priority, pruned_completed_count, pruned_failed_count
                     FROM awa.queue_terminal_rollups WHERE queue = ANY($1)) AS rollups
    USING (queue, priority)
), live AS (
    SELECT GREATEST(0,
        COALESCE((SELECT sum(live_terminal_count) FROM awa.queue_terminal_live_counts WHERE queue = ANY($1)), 0)
      + COALESCE((SELECT sum(terminal_delta) FROM awa.queue_terminal_count_deltas WHERE queue = ANY($1)), 0)
      + COALESCE((SELECT sum(completed_count) FROM awa.receipt_completion_batches WHERE queue = ANY($1)), 0)
      - COALESCE((SELECT count(*) FROM awa.receipt_completion_tombstones WHERE queue = ANY($1)), 0)
    )::bigint AS n
)
SELECT pruned.n + live.n FROM pruned CROSS JOIN live
"#;

/// Physical queue names behind the logical queue (stripes are `queue#i`).
fn physical_queues(stripes: usize) -> Vec<String> {
    if stripes <= 1 {
        vec![QUEUE.to_string()]
    } else {
        (0..stripes).map(|i| format!("{QUEUE}#{i}")).collect()
    }
}

async fn terminal_count(pool: &sqlx::PgPool, queues: &[String]) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(TERMINAL_SQL).bind(queues).fetch_one(pool).await
}

#[derive(Debug, Clone, Serialize, Deserialize, JobArgs)]
struct BurndownNoop {}

struct Args {
    jobs: usize,
    concurrency: u32,
    stripes: usize,
    claimers: u16,
    zero_deadline: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { jobs: 200_000, concurrency: 24, stripes: 1, claimers: 1, zero_deadline: false };
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
            "--concurrency" => {
                args.concurrency = u32::try_from(value()?).map_err(|_| "--concurrency too large")?
            }
            // Optional, off by default: not part of the contract.
            "--stripes" => args.stripes = value()?,
            "--claimers" => {
                args.claimers = u16::try_from(value()?).map_err(|_| "--claimers too large")?
            }
            "--zero-deadline" => args.zero_deadline = true,
            "-h" | "--help" => {
                eprintln!(
                    "usage: awa-burndown [--jobs N (200000)] [--concurrency C (24)]\n\
                     \x20      [--stripes S (1, queue_stripe_count)] [--claimers K (1)] [--zero-deadline]\n\
                     env: DATABASE_URL"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument: {other}")),
        }
    }
    if args.jobs == 0 || args.concurrency == 0 || args.stripes == 0 || args.claimers == 0 {
        return Err("--jobs, --concurrency, --stripes and --claimers must be > 0".into());
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
        eprintln!("awa-burndown: error: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set")?;
    let (n, c) = (args.jobs, args.concurrency);

    let pool = PgPoolOptions::new().max_connections(POOL_SIZE).connect(&url).await?;
    // Separate one-connection pool for the count poll so it never competes
    // with the runtime's pool.
    let probe = PgPoolOptions::new().max_connections(1).connect(&url).await?;

    // Library migrations (idempotent, advisory-locked) + queue-storage install
    // (idempotent), then reset: TRUNCATEs awa's own queue-storage tables
    // (schema `awa` only) so leftovers of earlier runs are gone.
    awa::migrations::run(&pool).await?;
    let storage_config = QueueStorageConfig {
        queue_stripe_count: args.stripes,
        ..QueueStorageConfig::default()
    };
    let store = QueueStorage::new(storage_config.clone())?;
    store.install(&pool).await?;
    store.reset(&pool).await?;
    eprintln!(
        "[awa] migrated + queue storage installed/reset; schema={} jobs={n} max_workers={c} \
         stripes={} deadline={} claim_batch_size={} claimers={}",
        store.schema(),
        args.stripes,
        if args.zero_deadline { "0" } else { "default(5m)" },
        QueueConfig::default().claim_batch_size,
        args.claimers,
    );

    // Insert: direct queue-storage COPY, 5,000 per call.
    let t0 = Instant::now();
    let mut inserted = 0usize;
    while inserted < n {
        let k = INSERT_BATCH.min(n - inserted);
        let params = (0..k)
            .map(|_| {
                awa::model::insert::params_with(
                    &BurndownNoop {},
                    InsertOpts { queue: QUEUE.into(), ..InsertOpts::default() },
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        inserted += store.enqueue_params_copy(&pool, &params).await?;
    }
    let insert_s = t0.elapsed().as_secs_f64();
    if !store.terminal_counter_trusted(&probe).await? {
        return Err("awa terminal counters are not trusted; TERMINAL_SQL would undercount".into());
    }
    let queues = physical_queues(args.stripes);
    let before = terminal_count(&probe, &queues).await?;
    eprintln!("[awa] inserted {n} in {insert_s:.3}s ({:.0}/s)", n as f64 / insert_s);

    let mut queue_config = QueueConfig {
        max_workers: c,
        poll_interval: POLL_INTERVAL,
        claimers: args.claimers,
        ..QueueConfig::default()
    };
    if args.zero_deadline {
        queue_config.deadline_duration = Duration::ZERO;
    }
    let ran = Arc::new(AtomicU64::new(0));
    let ran_handler = ran.clone();
    let client = Client::builder(pool.clone())
        .queue(QUEUE, queue_config)
        .queue_storage(storage_config, ROTATE_INTERVAL, ROTATE_INTERVAL)
        .register::<BurndownNoop, _, _>(move |_args, _ctx| {
            let ran = ran_handler.clone();
            async move {
                ran.fetch_add(1, Ordering::Relaxed);
                Ok(JobResult::Completed)
            }
        })
        .build()?;

    // Drain: time from start() until awa's exact counts show all N terminal.
    let target = before + n as i64;
    let t1 = Instant::now();
    client.start().await?;
    let mut polls = 0u64;
    let mut poll_time = Duration::ZERO;
    let mut last_poll = Instant::now();
    loop {
        tokio::time::sleep(POLL_EVERY).await;
        // The terminal count cannot reach the target before the handler has
        // run N times, so until then poll only once a second, to keep the
        // probe's load off the worker being timed.
        if ran.load(Ordering::Relaxed) < n as u64 && last_poll.elapsed() < SLOW_POLL_EVERY {
            continue;
        }
        last_poll = Instant::now();
        let p = Instant::now();
        let terminal = terminal_count(&probe, &queues).await?;
        poll_time += p.elapsed();
        polls += 1;
        if terminal >= target {
            break;
        }
        if t1.elapsed() > DRAIN_TIMEOUT {
            return Err(format!("timeout: {} of {n} terminal", terminal - before).into());
        }
    }
    let drain_s = t1.elapsed().as_secs_f64();
    eprintln!(
        "[awa] drained {n} in {drain_s:.3}s ({:.0}/s); handler ran {} times; {polls} polls, mean poll {:.2} ms",
        n as f64 / drain_s,
        ran.load(Ordering::Relaxed),
        poll_time.as_secs_f64() * 1000.0 / polls.max(1) as f64
    );

    client.shutdown(Duration::from_secs(10)).await;
    // Untimed cross-check with awa's full exact counts.
    let v = Instant::now();
    let exact = store.queue_counts(&probe, QUEUE).await?;
    eprintln!(
        "[awa] exact queue_counts after drain ({:.1}s): available={} running={} terminal={}",
        v.elapsed().as_secs_f64(),
        exact.available,
        exact.running,
        exact.terminal
    );
    if exact.available != 0 || exact.running != 0 || exact.terminal < target {
        return Err(format!(
            "exact counts disagree: available={} running={} terminal={} (want terminal >= {target})",
            exact.available, exact.running, exact.terminal
        )
        .into());
    }
    // Leave the shared database lean: drop this run's queue-storage rows.
    if let Err(e) = store.reset(&pool).await {
        eprintln!("[awa] post-run reset failed (next run resets anyway): {e}");
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
