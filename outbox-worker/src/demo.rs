//! `outbox-worker demo`: the README's first command. Starts a private
//! PostgreSQL unless DATABASE_URL is set, submits a mixed workload in one
//! transaction, runs a worker until every task has finished or died, and
//! prints a summary.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use outbox::{Batch, TaskEventKind, Worker};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::builtin::{self, Fail, Noop, Sleep};
use crate::cli::{DemoArgs, Failure, connect};
use crate::local_postgres::{LocalPostgres, LocalPostgresOptions};

const SLEEPERS: usize = 20;
const RECOVERING: usize = 10;
const DOOMED: usize = 3;

pub(crate) async fn run(
    args: DemoArgs,
    register: fn(outbox::WorkerBuilder) -> outbox::WorkerBuilder,
) -> Result<(), Failure> {
    let (url, _cluster) = match args.database_url {
        Some(url) => (url, None),
        None => {
            println!("starting a private PostgreSQL (set DATABASE_URL to use your own)...");
            let cluster = tokio::task::spawn_blocking(|| {
                LocalPostgres::start(&LocalPostgresOptions::default())
            })
            .await
            .map_err(Failure::runtime)?
            .map_err(|e| Failure::runtime(format!("cannot start a private PostgreSQL: {e}")))?;
            (cluster.url("postgres"), Some(cluster))
        }
    };
    let pool = connect(&url, 20).await?;
    let report = outbox::migrate(&pool).await?;
    println!("schema at version {}", report.current);

    let mut batch = Batch::new();
    for _ in 0..args.tasks {
        batch.push(&Noop {})?;
    }
    for _ in 0..SLEEPERS {
        batch.push(&Sleep { ms: 200 })?;
    }
    for _ in 0..RECOVERING {
        batch.push(&Fail {
            times: 1,
            message: "flaky downstream (fails once)".into(),
        })?;
    }
    for _ in 0..DOOMED {
        batch.push(&Fail {
            times: 99,
            message: "poison task (always fails)".into(),
        })?;
    }
    let total = batch.len();
    let started = Instant::now();
    let mut tx = pool.begin().await.map_err(outbox::Error::from)?;
    let ids = batch.submit(&mut *tx).await?;
    tx.commit().await.map_err(outbox::Error::from)?;
    println!(
        "submitted {total} tasks in one transaction in {:.0} ms",
        started.elapsed().as_secs_f64() * 1000.0
    );

    let worker = register(builtin::register(Worker::builder(pool.clone())))
        .queue(outbox::DEFAULT_QUEUE, 32)
        .build()?;
    let mut events = worker.subscribe();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    tokio::spawn(crate::cli::stop_on_signal(shutdown.clone()));

    let started = Instant::now();
    let mut counts: BTreeMap<(String, &'static str), usize> = BTreeMap::new();
    let mut finished = 0;
    let mut dead_ids = Vec::new();
    let mut last_print = Instant::now();
    while finished < total && !shutdown.is_cancelled() {
        let event = match tokio::time::timeout(Duration::from_secs(60), events.recv()).await {
            Ok(Ok(e)) => e,
            Ok(Err(RecvError::Lagged(_))) => continue,
            Ok(Err(RecvError::Closed)) | Err(_) => break,
        };
        let label = match event.kind {
            TaskEventKind::Completed => "completed",
            TaskEventKind::Failed => "failed (will retry)",
            TaskEventKind::Dead => "dead",
            _ => "other",
        };
        *counts.entry((event.task_type.clone(), label)).or_default() += 1;
        if matches!(event.kind, TaskEventKind::Completed | TaskEventKind::Dead) {
            finished += 1;
        }
        if event.kind == TaskEventKind::Dead {
            dead_ids.push(event.id);
        }
        if last_print.elapsed() > Duration::from_millis(500) {
            println!("  {finished}/{total} finished");
            last_print = Instant::now();
        }
    }
    let elapsed = started.elapsed();
    shutdown.cancel();
    running.await.map_err(Failure::runtime)??;

    println!(
        "\n{finished}/{total} tasks finished in {:.2} s",
        elapsed.as_secs_f64()
    );
    println!("{:<16} {:<22} {:>8}", "task type", "outcome", "count");
    for ((task_type, label), n) in &counts {
        println!("{task_type:<16} {label:<22} {n:>8}");
    }
    let dead: Vec<String> = dead_ids.iter().map(ToString::to_string).collect();
    println!(
        "\ndead tasks (ids {}) are kept for inspection:",
        dead.join(", ")
    );
    println!(
        "  psql \"{url}\" -c \"SELECT id, task_type, retry_count, last_error FROM outbox_tasks WHERE dead_at IS NOT NULL\""
    );
    if finished < total || ids.len() != total {
        return Err(Failure::runtime(format!(
            "only {finished} of {total} tasks finished"
        )));
    }
    Ok(())
}
