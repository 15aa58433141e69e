//! `outbox-worker demo`: the README's first command. Starts a private
//! PostgreSQL unless DATABASE_URL is set, submits a mixed workload in one
//! transaction, runs a worker with a live progress bar until every task has
//! finished or died, and ends with a summary and the commands to inspect and
//! retry the dead tasks.

use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use outbox::{Batch, TaskEventKind, TaskOptions, Worker};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::Register;
use crate::builtin::{self, Fail, Noop, Sleep};
use crate::connect::{connect, database_or_private};
use crate::failure::Failure;
use crate::flags;
use crate::local_postgres::LocalPostgresOptions;

const SLEEPERS: usize = 50;
const FLAKY: usize = 20;
const DOOMED: usize = 3;

/// `demo`'s flags.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Use this database instead of a private one (it is then kept).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    /// How many no-op tasks to submit (besides the sleeping and failing ones).
    #[arg(long, default_value_t = 5000, value_parser = flags::count(0, 10_000_000))]
    pub(crate) tasks: usize,
    /// Worker concurrency.
    #[arg(long, default_value_t = 32, value_parser = flags::count(1, outbox::MAX_CONCURRENCY as u64))]
    pub(crate) concurrency: usize,
    /// No progress bar (for logs and CI).
    #[arg(long)]
    pub(crate) no_progress: bool,
    /// Leave the private PostgreSQL running after the demo, to try the
    /// operator commands it suggests on its tasks (the command that stops
    /// it is printed).
    #[arg(long)]
    pub(crate) keep: bool,
}

pub(crate) async fn run(args: DemoArgs, register: &Register) -> Result<(), Failure> {
    if args.database_url.is_none() {
        println!(
            "{}",
            if args.keep {
                "Starting a private PostgreSQL (kept after the demo: --keep)..."
            } else {
                "Starting a private PostgreSQL (removed at exit; --keep keeps it, DATABASE_URL \
                 uses your own)..."
            }
        );
    }
    let (url, cluster) =
        database_or_private(args.database_url, LocalPostgresOptions::default()).await?;
    let pool = connect(&url, 20).await?;
    let report = outbox::migrate(&pool).await?;
    println!("Schema at version {}.", report.current);

    // The workload: many no-ops, some slow tasks, some that fail once or
    // twice and then succeed, and a few that never succeed and die.
    let mut batch = Batch::new();
    for _ in 0..args.tasks {
        batch.push(&Noop {})?;
    }
    for i in 0..SLEEPERS {
        batch.push_with(
            &Sleep {
                ms: 100 + 10 * i as u64,
            },
            TaskOptions::new().priority(5),
        )?;
    }
    for i in 0..FLAKY {
        let times = 1 + (i % 2) as i32;
        batch.push(&Fail {
            times,
            message: format!("flaky downstream (fails {times}x, then works)"),
        })?;
    }
    for _ in 0..DOOMED {
        batch.push(&Fail {
            times: 99,
            message: "poison task: always fails".into(),
        })?;
    }
    let total = batch.len() as u64;
    let started = Instant::now();
    let mut tx = pool.begin().await.map_err(outbox::Error::from)?;
    batch.submit(&mut tx).await?;
    tx.commit().await.map_err(outbox::Error::from)?;
    println!(
        "Submitted {total} tasks in one transaction in {:.0} ms: {} outbox.noop, {SLEEPERS} outbox.sleep, \
         {} outbox.fail ({DOOMED} of which always fail).",
        started.elapsed().as_secs_f64() * 1000.0,
        args.tasks,
        FLAKY + DOOMED
    );

    let worker = register(builtin::register(Worker::builder(pool.clone())))
        .queue(outbox::DEFAULT_QUEUE, args.concurrency.max(1))
        .build()?;
    let mut events = worker.subscribe();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    tokio::spawn(crate::signals::stop_on_signal(shutdown.clone()));

    let bar = if args.no_progress {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} finished  {msg}",
        )
        .map_err(Failure::runtime)?,
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    let started = Instant::now();
    let (mut finished, mut retries, mut dead) = (0u64, 0u64, 0u64);
    while finished < total && !shutdown.is_cancelled() {
        let event = match tokio::time::timeout(Duration::from_secs(60), events.recv()).await {
            Ok(Ok(e)) => e,
            Ok(Err(RecvError::Lagged(_))) => continue,
            Ok(Err(RecvError::Closed)) | Err(_) => break,
        };
        match event.kind {
            TaskEventKind::Completed => finished += 1,
            TaskEventKind::Dead => {
                finished += 1;
                dead += 1;
            }
            TaskEventKind::Failed => retries += 1,
            _ => {}
        }
        bar.set_position(finished);
        bar.set_message(format!("{retries} failures retried, {dead} dead"));
    }
    bar.finish();
    let elapsed = started.elapsed();
    shutdown.cancel();
    running.await.map_err(Failure::runtime)??;

    println!(
        "\n{finished} of {total} tasks finished in {:.2} s ({:.0} tasks/s, including retry back-off).\n",
        elapsed.as_secs_f64(),
        finished as f64 / elapsed.as_secs_f64().max(1e-9)
    );
    print_summary(&pool).await?;
    let shown_url = match &cluster {
        Some(_) if args.keep => url.clone(),
        Some(_) => "postgres://...".to_owned(),
        None => "\"$DATABASE_URL\"".to_owned(),
    };
    let bin = crate::connect::this_command();
    println!("\nDead tasks wait for an operator. To inspect and retry them:");
    println!("  {bin} tasks list --dead --database-url {shown_url}");
    println!("  {bin} tasks show <ID> --database-url {shown_url}");
    println!("  {bin} tasks retry --dead --type outbox.fail --database-url {shown_url}");
    pool.close().await;
    match cluster {
        Some(cluster) if args.keep => println!(
            "The private PostgreSQL keeps running for these commands; stop it and remove its \
             files with:\n  {}",
            cluster.keep()
        ),
        Some(cluster) => {
            println!(
                "(This run's private database is removed now; run the demo with --keep to try \
                 these commands on its tasks.)"
            );
            drop(cluster);
        }
        None => {}
    }
    if finished < total {
        return Err(Failure::runtime(format!(
            "only {finished} of {total} tasks finished"
        )));
    }
    Ok(())
}

async fn print_summary(pool: &sqlx::PgPool) -> Result<(), Failure> {
    let counts = outbox::admin::count_by_type_and_state(pool).await?;
    println!("{:<14} {:<10} {:>7}", "task type", "state", "tasks");
    for c in &counts {
        println!("{:<14} {:<10} {:>7}", c.task_type, c.state, c.count);
    }
    let dead = outbox::admin::list_tasks(pool, Some("dead"), None, 10).await?;
    if !dead.is_empty() {
        println!("\nDead tasks:");
        for t in dead {
            println!(
                "  id {:<8} {:<12} attempts {}/{}  last error: {}",
                t.id,
                t.task_type,
                t.retry_count,
                t.max_attempts,
                t.last_error.unwrap_or_default()
            );
        }
    }
    Ok(())
}
