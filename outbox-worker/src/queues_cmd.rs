//! `queues list | pause | resume | set | delete` and `workers list`: the cluster's
//! queue settings and its workers, as they are in the database.

use clap::{Args, Subcommand};
use outbox::admin::{self, QueueChange, QueueDeletion, QueueSettings};

use crate::connect::{DbArgs, connect_operator_migrated};
use crate::failure::{Failure, names_or};
use crate::flags;

/// `queues` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum QueuesCommand {
    /// Every queue's settings and live counts.
    List(JsonArgs),
    /// Stop new claims of a queue on every worker (running tasks finish).
    Pause(NameArgs),
    /// Let a paused queue be claimed again.
    Resume(NameArgs),
    /// Change a queue's limits for the whole cluster.
    Set(SetArgs),
    /// Forget a queue left behind: its settings row (pause and limits),
    /// refused while a live worker serves it or tasks wait or run on it.
    Delete(DeleteArgs),
}

#[derive(Debug, Args)]
pub(crate) struct DeleteArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The queue.
    name: String,
}

#[derive(Debug, Args)]
pub(crate) struct JsonArgs {
    #[command(flatten)]
    db: DbArgs,
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct NameArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The queue.
    name: String,
    /// Set it even though no worker serves it yet and it has no tasks (to
    /// pause or limit a queue before its workers start).
    #[arg(long)]
    create: bool,
}

#[derive(Debug, Args)]
pub(crate) struct SetArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The queue.
    name: String,
    /// Set it even though no worker serves it yet and it has no tasks.
    #[arg(long)]
    create: bool,
    /// At most this many of its tasks running at once across all workers
    /// (1 to 1000000), or `none`.
    #[arg(long, value_parser = parse_limit)]
    global_concurrency: Option<OrNone<i32>>,
    /// At most this many attempts started, across all workers: N/s, N/m or
    /// N/h (N a positive number; at most 1000000/s), or `none`.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<OrNone<f64>>,
    /// Tasks of one ordering key running at once (1 to 1000000; default 1).
    #[arg(long, value_parser = flags::int_i32(1, admin::MAX_QUEUE_LIMIT))]
    per_key_concurrency: Option<i32>,
}

/// A setting's new value, or `none` to remove it (a type of its own: clap
/// reads `Option<Option<T>>` as a flag whose value may be left out).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OrNone<T>(Option<T>);

fn parse_limit(s: &str) -> Result<OrNone<i32>, String> {
    if s == "none" {
        return Ok(OrNone(None));
    }
    flags::int_i32(1, admin::MAX_QUEUE_LIMIT)(s).map(|n| OrNone(Some(n)))
}

fn parse_rate(s: &str) -> Result<OrNone<f64>, String> {
    flags::rate(s).map(OrNone)
}

pub(crate) async fn queues(command: QueuesCommand) -> Result<(), Failure> {
    match command {
        QueuesCommand::List(args) => list(args).await,
        QueuesCommand::Pause(args) => {
            let pool = connect_operator_migrated(&args.db, 1).await?;
            known(&pool, &args.name, args.create).await?;
            let done = admin::pause_queue(&pool, &args.name).await?;
            println!("paused {} (running tasks finish)", done.name);
            Ok(())
        }
        QueuesCommand::Resume(args) => {
            let pool = connect_operator_migrated(&args.db, 1).await?;
            known(&pool, &args.name, args.create).await?;
            let done = admin::resume_queue(&pool, &args.name).await?;
            println!("resumed {}", done.name);
            Ok(())
        }
        QueuesCommand::Set(args) => {
            let change = QueueChange {
                paused: None,
                global_concurrency: args.global_concurrency.map(|v| v.0),
                rate_per_second: args.rate.map(|v| v.0),
                per_key_concurrency: args.per_key_concurrency,
            };
            if change == QueueChange::default() {
                return Err(Failure::config(
                    "nothing to set: give --global-concurrency, --rate or --per-key-concurrency",
                ));
            }
            let pool = connect_operator_migrated(&args.db, 1).await?;
            known(&pool, &args.name, args.create).await?;
            let done = admin::set_queue(&pool, &args.name, &change).await?;
            println!("{}: {}", done.name, limits(&done));
            Ok(())
        }
        QueuesCommand::Delete(args) => delete(args).await,
    }
}

async fn delete(args: DeleteArgs) -> Result<(), Failure> {
    admin::check_queue_name(&args.name)?;
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let name = &args.name;
    match admin::delete_queue(&pool, name).await? {
        QueueDeletion::Deleted => {
            println!("deleted the settings of {name}");
            Ok(())
        }
        QueueDeletion::NotFound => {
            let names = admin::list_queues(&pool).await?.into_iter().map(|q| q.name);
            Err(Failure::runtime(format!(
                "no queue named {name:?} has settings (queues with settings: {})",
                names_or(names, "none")
            )))
        }
        QueueDeletion::Served(n) => Err(Failure::config(format!(
            "{n} live worker(s) serve {name} (`workers list` shows them) and would add it \
             back: take it out of their queues first (to lift its pause or limits, use \
             `queues resume` or `queues set`)"
        ))),
        QueueDeletion::Unfinished => Err(Failure::config(format!(
            "tasks wait or run on {name} (`queues list --json` counts them: available, \
             scheduled, retrying, blocked, processing): let them finish or cancel them first"
        ))),
    }
}

/// Refuses a queue the cluster has never heard of (see
/// [`admin::unknown_queue`]) unless `create`: a mistyped name would
/// otherwise be paused or limited silently, and listed from then on.
async fn known(pool: &sqlx::PgPool, name: &str, create: bool) -> Result<(), Failure> {
    admin::check_queue_name(name)?;
    if create {
        return Ok(());
    }
    match admin::unknown_queue(pool, name).await? {
        None => Ok(()),
        Some(names) => Err(Failure::config(format!(
            "no queue named {name:?}: no worker serves it and it has no tasks (queues: {}); \
             pass --create to set it before its workers start",
            names_or(names, "none yet")
        ))),
    }
}

fn limits(q: &QueueSettings) -> String {
    format!(
        "{}, global concurrency {}, rate {}, per-key concurrency {}",
        if q.paused_at.is_some() {
            "paused"
        } else {
            "running"
        },
        q.global_concurrency
            .map_or("none".to_owned(), |n| n.to_string()),
        q.rate_per_second
            .map_or("none".to_owned(), outbox::admin::show_rate),
        q.per_key_concurrency
    )
}

async fn list(args: JsonArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let queues = admin::list_queues(&pool).await?;
    let overview = admin::overview(&pool).await?;
    let unset = admin::queues_without_settings(&queues, &overview);
    if args.json {
        let rows: Vec<_> = queues
            .iter()
            .map(|q| {
                let counts = overview.queues.iter().find(|o| o.queue == q.name);
                serde_json::json!({"name": q.name, "settings": q, "counts": counts})
            })
            .chain(unset.iter().map(|counts| {
                serde_json::json!({"name": counts.queue, "settings": null, "counts": counts})
            }))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(Failure::runtime)?
        );
        return Ok(());
    }
    println!(
        "{:<20} {:<8} {:>8} {:>10} {:>8} {:>10} {:>8} {:>8} {:>6}",
        "queue", "state", "global", "rate", "per key", "available", "blocked", "running", "dead"
    );
    let row = |name: &str, state: &str, global: String, rate: String, per_key: i32| {
        let counts = overview.queues.iter().find(|o| o.queue == name);
        let count = |f: fn(&admin::QueueOverview) -> i64| counts.map_or(0, f);
        println!(
            "{:<20} {:<8} {:>8} {:>10} {:>8} {:>10} {:>8} {:>8} {:>6}",
            name,
            state,
            global,
            rate,
            per_key,
            count(|o| o.available),
            count(|o| o.blocked),
            count(|o| o.processing),
            count(|o| o.dead),
        );
    };
    for q in &queues {
        row(
            &q.name,
            if q.paused_at.is_some() {
                "paused"
            } else {
                "running"
            },
            q.global_concurrency
                .map_or("-".to_owned(), |n| n.to_string()),
            q.rate_per_second
                .map_or("-".to_owned(), outbox::admin::show_rate),
            q.per_key_concurrency,
        );
    }
    for counts in &unset {
        row(&counts.queue, "default", "-".to_owned(), "-".to_owned(), 1);
    }
    if queues.is_empty() && unset.is_empty() {
        println!("(no queues: workers add theirs when they start)");
    } else if !unset.is_empty() {
        println!(
            "(default: tasks but no settings yet; a worker serving the queue or `queues set` adds them)"
        );
    }
    Ok(())
}

/// `workers` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum WorkersCommand {
    /// Workers that reported themselves: alive ones first, then those gone
    /// (maintenance removes them later).
    List(JsonArgs),
}

pub(crate) async fn workers(command: WorkersCommand) -> Result<(), Failure> {
    let WorkersCommand::List(args) = command;
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let all = admin::list_workers(&pool).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&all).map_err(Failure::runtime)?
        );
        return Ok(());
    }
    println!(
        "{:<40} {:<6} {:<6} {:<16} {:>7}  {:<20} {:<20} queues",
        "id", "state", "leader", "host", "pid", "started (UTC)", "last seen (UTC)"
    );
    for w in &all {
        let queues: Vec<String> = w
            .queues
            .iter()
            .map(|q| format!("{}={}", q.queue, q.concurrency))
            .collect();
        println!(
            "{:<40} {:<6} {:<6} {:<16} {:>7}  {:<20} {:<20} {}",
            w.id,
            if w.alive { "alive" } else { "gone" },
            if w.leader { "yes" } else { "" },
            w.host,
            w.pid,
            crate::when::column(w.started_at),
            crate::when::column(w.last_seen_at),
            queues.join(",")
        );
    }
    if all.is_empty() {
        println!("(no workers)");
    }
    Ok(())
}
