//! `tasks ...` and `stats`: what an operator runs from the shell.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{Args, Subcommand};
use outbox::admin::{self, STATES, TaskRecord};
use outbox::{Batch, TaskId, TaskOptions};
use serde::Serialize;

use crate::connect::{DbArgs, connect_operator_migrated};
use crate::failure::Failure;
use crate::flags::{self, DAY};

/// `tasks` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum TasksCommand {
    /// Submit a task by type name with a JSON payload.
    Submit(SubmitArgs),
    /// List tasks, newest first.
    List(ListArgs),
    /// Show everything about one task.
    Show(ShowArgs),
    /// Make FAILED tasks claimable now with a fresh attempt budget,
    /// scheduled ones (pending, due later) due now, and completed ones run
    /// again.
    Retry(RetryArgs),
    /// Cancel tasks: waiting ones become dead at once; running ones are
    /// stopped (their worker fires the task's cancellation token) and end
    /// dead, never retried. A cancelled task lets its ordering key go on;
    /// cancelling a dead task that holds its key skips it.
    Cancel(CancelArgs),
    /// Why a task is not running now: scheduled, waiting for a retry,
    /// behind another task of its ordering key, its queue paused or at its
    /// limit, no live worker for its queue, or dead (and why).
    Explain(ShowArgs),
    /// Send a signal to a task that waits for it (`ctx.wait_for(NAME)`):
    /// the task wakes and reads the value. The first signal of a name wins.
    Signal(SignalArgs),
}

#[derive(Debug, Args)]
pub(crate) struct SignalArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The task id.
    id: i64,
    /// The signal's name, as the handler waits for it.
    name: String,
    /// The value as JSON (`-` reads standard input, `@FILE` a file);
    /// `null` when not given.
    value: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    #[command(flatten)]
    db: DbArgs,
    /// A registered task type (the error lists the known ones).
    task_type: String,
    /// The payload as JSON; `-` reads it from standard input and `@FILE`
    /// from a file (at most 16 MiB either way).
    payload: String,
    /// Run no earlier than this from now (e.g. 30s, 5m).
    #[arg(allow_hyphen_values = true, long, value_parser = flags::duration(Duration::ZERO, 36_500 * DAY))]
    delay: Option<Duration>,
    /// Priority, 0 (first) to 9 (last).
    #[arg(long, value_parser = flags::int_i16(0, 9))]
    priority: Option<i16>,
    /// Queue, instead of the task type's own.
    #[arg(long)]
    queue: Option<String>,
    /// Make the task unique by this key (within its type): while a task with
    /// the key is pending, running or waiting for a retry, nothing is
    /// written and the existing task's id is printed with "duplicate".
    #[arg(long)]
    unique_key: Option<String>,
    /// With --unique-key: the key counts within one period (1s to 100
    /// years, e.g. 1h, counted from the Unix epoch), so a later period takes
    /// a new task. A task that completed within the period is not counted
    /// unless --unique-including completed.
    #[arg(allow_hyphen_values = true, long, requires = "unique_key", value_parser = flags::duration(Duration::from_secs(1), 36_500 * DAY))]
    unique_period: Option<Duration>,
    /// With --unique-key: also count tasks in these states, comma-separated:
    /// `completed` (until cleanup deletes them; with --unique-period, at
    /// most one task per period, run or not) and `dead` (until an operator
    /// retries or deletes them).
    #[arg(long, requires = "unique_key", value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(["completed", "dead"]))]
    unique_including: Vec<String>,
    /// Ordering key (instead of the task type's own): tasks with the same
    /// key in a queue run one at a time, in commit order.
    #[arg(long)]
    ordering_key: Option<String>,
    /// How many attempts the task gets (1, no retry, to 10000), instead of
    /// its type's; past the type's retry table its last delay repeats.
    #[arg(long, value_parser = flags::count_u32(1, outbox::MAX_ATTEMPTS_LIMIT.into()))]
    max_attempts: Option<u32>,
    /// Print {"id": N, "duplicate": BOOL} instead of the id.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Only tasks in this state.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(STATES))]
    state: Option<String>,
    /// Only dead tasks (same as --state dead).
    #[arg(long, conflicts_with = "state")]
    dead: bool,
    /// Only tasks of this type.
    #[arg(long = "type")]
    task_type: Option<String>,
    /// Only tasks of this queue.
    #[arg(long)]
    queue: Option<String>,
    /// At most this many (1 to 100000).
    #[arg(long, default_value_t = 50, value_parser = flags::int_i64(1, 100_000))]
    limit: i64,
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    #[command(flatten)]
    pub(crate) db: DbArgs,
    /// The task id.
    pub(crate) id: i64,
    /// JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RetryArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Task ids to retry: failed or dead ones get a fresh attempt budget,
    /// scheduled ones (pending, due later) become due now, completed ones
    /// run again (not a workflow's step).
    // Not required with --type alone: `retry` itself then says to add
    // --dead (clap's own message listed --dead and ids together).
    #[arg(required_unless_present_any = ["dead", "task_type"], conflicts_with = "dead")]
    ids: Vec<i64>,
    /// Retry every dead task (of --type, if given).
    #[arg(long)]
    dead: bool,
    /// With --dead: only dead tasks of this type.
    #[arg(long = "type")]
    task_type: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct CancelArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Task ids to cancel.
    #[arg(required = true)]
    ids: Vec<i64>,
}

/// `stats`'s flags.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    #[command(flatten)]
    db: DbArgs,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn tasks(command: TasksCommand) -> Result<(), Failure> {
    match command {
        TasksCommand::Submit(args) => submit(args).await,
        TasksCommand::List(args) => list(args).await,
        TasksCommand::Show(args) => show(args).await,
        TasksCommand::Retry(args) => retry(args).await,
        TasksCommand::Cancel(args) => cancel(args).await,
        TasksCommand::Explain(args) => crate::explain_cmd::explain(args).await,
        TasksCommand::Signal(args) => signal(args).await,
    }
}

async fn submit(args: SubmitArgs) -> Result<(), Failure> {
    let registered = crate::task_types::registered(&args.task_type)?;
    let (text, payload) = crate::payload::json(&args.payload)?;
    (registered.check_payload)(&text).map_err(|e| {
        Failure::config(format!(
            "the payload does not fit task type {:?}: {e}",
            registered.task_type
        ))
    })?;
    let unique = args.unique_key.is_some();
    let mut options = TaskOptions::new();
    if let Some(d) = args.delay {
        options = options.delay(d);
    }
    if let Some(p) = args.priority {
        options = options.priority(p);
    }
    if let Some(q) = args.queue {
        options = options.queue(q);
    }
    if let Some(key) = args.unique_key {
        let mut unique = outbox::Unique::key(key);
        if let Some(period) = args.unique_period {
            unique = unique.per(period);
        }
        for state in &args.unique_including {
            unique = match state.as_str() {
                "completed" => unique.including_completed(),
                _ => unique.including_dead(),
            };
        }
        options = options.unique(unique);
    }
    if let Some(key) = args.ordering_key {
        options = options.ordering_key(key);
    }
    if let Some(n) = args.max_attempts {
        options = options.max_attempts(n);
    }
    let mut batch = Batch::new();
    batch.push_json(registered, &payload, options)?;
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let done = crate::commit::write_and_commit(
        &pool,
        async |conn| Ok(batch.submit_detailed(conn).await?[0]),
        |done| crate::commit::Write {
            what: format!("task {}", done.id),
            retry: if unique {
                "running the same command again is safe: its unique key makes a second \
                 submit a duplicate"
                    .to_owned()
            } else {
                format!(
                    "`tasks show {}` says whether it was, once the database answers; \
                     submit with --unique-key to make a retry safe",
                    done.id
                )
            },
        },
    )
    .await?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"id": done.id, "duplicate": done.duplicate})
        );
    } else if done.duplicate {
        println!("{} duplicate", done.id);
    } else {
        println!("{}", done.id);
    }
    Ok(())
}

async fn list(args: ListArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let state = if args.dead {
        Some("dead")
    } else {
        args.state.as_deref()
    };
    let filter = admin::TaskFilter {
        state: state.map(str::to_owned),
        task_type: args.task_type,
        queue: args.queue,
        ..admin::TaskFilter::default()
    };
    let tasks = admin::list_tasks_where(&pool, &filter, args.limit).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&tasks).map_err(Failure::runtime)?
        );
        return Ok(());
    }
    println!(
        "{:>10}  {:<24} {:<12} {:<10} {:>8}  {:<20}  last error",
        "id", "type", "queue", "state", "failed", "execute at (UTC)"
    );
    for t in &tasks {
        println!(
            "{:>10}  {:<24} {:<12} {:<10} {:>8}  {:<20}  {}",
            t.id,
            t.task_type,
            t.queue,
            t.state,
            format!("{}/{}", t.retry_count, t.max_attempts),
            crate::when::column(t.execute_at),
            one_line(t.last_error.as_deref().unwrap_or(""), 60)
        );
    }
    if tasks.is_empty() {
        println!("(no tasks)");
    }
    Ok(())
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > max {
        format!("{}...", flat.chars().take(max).collect::<String>())
    } else {
        flat
    }
}

async fn show(args: ShowArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let Some(t) = admin::get_task(&pool, TaskId(args.id)).await? else {
        return Err(Failure::runtime(format!("no task with id {}", args.id)));
    };
    let signals = admin::task_signals(&pool, TaskId(args.id)).await?;
    if args.json {
        let mut shown = serde_json::to_value(&t).map_err(Failure::runtime)?;
        shown["signals"] = serde_json::to_value(&signals).map_err(Failure::runtime)?;
        println!(
            "{}",
            serde_json::to_string_pretty(&shown).map_err(Failure::runtime)?
        );
    } else {
        print_task(&t, &signals);
    }
    Ok(())
}

/// A task as `tasks show` prints it, with the signals sent to it.
pub(crate) fn print_task(t: &TaskRecord, signals: &[outbox::admin::SignalRecord]) {
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| t.map_or("-".to_owned(), crate::when::at);
    println!("id            {}", t.id);
    println!("type          {}", t.task_type);
    println!("queue         {}", t.queue);
    println!("state         {}", t.state);
    println!("priority      {}", t.priority);
    println!(
        "attempts      {} failed of {} allowed ({} claim{})",
        t.retry_count,
        t.max_attempts,
        t.claims,
        if t.claims == 1 { "" } else { "s" }
    );
    println!("created at    {}", crate::when::at(t.created_at));
    println!("execute at    {}", crate::when::at(t.execute_at));
    println!("updated at    {}", crate::when::at(t.updated_at));
    println!("finished at   {}", time(t.finished_at));
    println!("dead at       {}", time(t.dead_at));
    println!("claimed by    {}", t.claimed_by.as_deref().unwrap_or("-"));
    println!("heartbeat at  {}", time(t.heartbeat_at));
    println!("last error    {}", t.last_error.as_deref().unwrap_or("-"));
    println!("unique key    {}", t.unique_key.as_deref().unwrap_or("-"));
    if let Some(key) = &t.ordering_key {
        let place = if t.blocked {
            ", waiting for it"
        } else if t.state == "dead" && t.skip_dead {
            ", skipped: later tasks of the key went on"
        } else if t.state == "dead" {
            ", holding it: later tasks of the key wait (tasks retry runs it, tasks cancel skips it)"
        } else {
            ""
        };
        println!(
            "ordering key  {key} (#{}{place})",
            t.key_seq.unwrap_or_default()
        );
    }
    println!("attempted at  {}", time(t.attempted_at));
    if let Some(result) = &t.result {
        println!(
            "result        {}",
            serde_json::to_string_pretty(result).unwrap_or_default()
        );
    }
    for s in signals {
        println!(
            "signal        {} = {} (sent {})",
            s.name,
            one_line(&s.value.to_string(), 200),
            crate::when::at(s.sent_at)
        );
    }
    println!(
        "payload       {}",
        serde_json::to_string_pretty(&t.payload).unwrap_or_default()
    );
}

async fn retry(args: RetryArgs) -> Result<(), Failure> {
    if args.task_type.is_some() && !args.dead {
        return Err(Failure::config(
            "--type picks which dead tasks to retry: give it with --dead \
             (tasks retry --dead --type TYPE); tasks given by id are retried whatever their type",
        ));
    }
    let pool = connect_operator_migrated(&args.db, 1).await?;
    if args.dead {
        let ids = admin::retry_dead(&pool, args.task_type.as_deref()).await?;
        println!("retried {} dead task(s){}", ids.len(), id_list(&ids));
        if let Some(wanted) = args.task_type.as_deref()
            && ids.is_empty()
        {
            // A misspelt type retries nothing, like a type with no dead
            // task: tell them apart (by the declared and registered types:
            // a lookup in the history would read it whole).
            let known = admin::known_task_types(&pool).await?;
            if !known.iter().any(|t| t == wanted) {
                eprintln!(
                    "no worker declares task type {wanted:?}, and this binary does not register \
                     it: a typo? The known types: {}",
                    known.join(", ")
                );
            }
        }
        return Ok(());
    }
    let wanted: Vec<TaskId> = args.ids.iter().copied().map(TaskId).collect();
    let done = admin::retry_tasks(&pool, &wanted).await?;
    println!("retried {} task(s){}", done.len(), id_list(&done));
    let missed = left_out(&wanted, &done);
    if missed.is_empty() {
        return Ok(());
    }
    let why = admin::why_not_retried(&pool, &missed).await?;
    let shown: Vec<String> = why
        .iter()
        .map(|(id, reason)| format!("{id} ({reason})"))
        .collect();
    Err(Failure::runtime(format!(
        "not retried{}",
        first_twenty(&shown, "; ")
    )))
}

async fn signal(args: SignalArgs) -> Result<(), Failure> {
    let value = match &args.value {
        Some(arg) => crate::payload::json(arg)?.1,
        None => serde_json::Value::Null,
    };
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let task = TaskId(args.id);
    let sent = crate::commit::write_and_commit(
        &pool,
        async |conn| Ok(outbox::signal(conn, task, &args.name, &value).await?),
        |_| crate::commit::Write {
            what: format!("signal {:?} to task {task}", args.name),
            retry: "running the same command again is safe: a task keeps the first signal \
                    of a name"
                .to_owned(),
        },
    )
    .await?;
    if !sent {
        // Which of the three it was: a second look, after the fact.
        let signals = admin::task_signals(&pool, task).await?;
        let why = match (
            admin::get_task(&pool, task).await?,
            signals.iter().find(|s| s.name == args.name),
        ) {
            (_, Some(first)) => format!(
                "it was sent one of that name already, at {} (a task keeps the first)",
                outbox::admin::show_time(first.sent_at)
            ),
            (None, None) => "there is no task with that id".to_owned(),
            (Some(t), None) => {
                format!("it has finished (state {}): nothing would read it", t.state)
            }
        };
        return Err(Failure::runtime(format!(
            "task {task} was not sent signal {:?}: {why}",
            args.name
        )));
    }
    println!("sent signal {:?} to task {task}", args.name);
    Ok(())
}

async fn cancel(args: CancelArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 1).await?;
    let wanted: Vec<TaskId> = args.ids.iter().copied().map(TaskId).collect();
    let done = admin::cancel_tasks(&pool, &wanted).await?;
    report(
        "cancelled",
        &wanted,
        &done,
        "finished, already dead, already being cancelled, or no such task",
    )
}

/// Prints what was done; fails (exit 1) if any requested id was not.
fn report(verb: &str, wanted: &[TaskId], done: &[TaskId], why_not: &str) -> Result<(), Failure> {
    println!("{verb} {} task(s){}", done.len(), id_list(done));
    let missed = left_out(wanted, done);
    if missed.is_empty() {
        Ok(())
    } else {
        Err(Failure::runtime(format!(
            "not {verb}{} ({why_not})",
            id_list(&missed)
        )))
    }
}

/// The ids asked for that were not done, in the order asked.
fn left_out(wanted: &[TaskId], done: &[TaskId]) -> Vec<TaskId> {
    wanted
        .iter()
        .filter(|id| !done.contains(id))
        .copied()
        .collect()
}

fn id_list(ids: &[TaskId]) -> String {
    first_twenty(ids, " ")
}

/// `: a b c` (joined by `sep`), the first twenty of `items` and how many
/// more; nothing when there are none.
fn first_twenty<T: std::fmt::Display>(items: &[T], sep: &str) -> String {
    if items.is_empty() {
        return String::new();
    }
    let shown: Vec<String> = items.iter().take(20).map(ToString::to_string).collect();
    let more = if items.len() > 20 {
        format!("{sep}and {} more", items.len() - 20)
    } else {
        String::new()
    };
    format!(": {}{more}", shown.join(sep))
}

/// What `stats --json` prints; the fields are documented in the README.
#[derive(Debug, Serialize)]
struct Stats {
    totals: BTreeMap<String, i64>,
    by_type: BTreeMap<String, BTreeMap<String, i64>>,
    dead: i64,
    in_flight: i64,
    claimable: i64,
    scheduled: i64,
    /// Waiting for earlier tasks of their ordering key.
    blocked: i64,
    oldest_claimable_age_seconds: f64,
    oldest_heartbeat_age_seconds: f64,
    /// Dead row versions in the task table not vacuumed yet (estimate).
    dead_tuples: i64,
    /// Live rows in the task table (estimate).
    live_tuples: i64,
    /// How long the oldest snapshot of a session of this database has been
    /// open (vacuum cannot clean behind it).
    oldest_snapshot_age_seconds: f64,
    /// The session holding it.
    oldest_snapshot_holder: Option<String>,
}

pub(crate) async fn stats(args: StatsArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 2).await?;
    let counts = admin::count_by_type_and_state(&pool).await?;
    let health = admin::queue_health(&pool).await?;
    let mut totals: BTreeMap<String, i64> = STATES.iter().map(|s| ((*s).to_owned(), 0)).collect();
    let mut by_type: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for c in counts {
        *totals.entry(c.state.clone()).or_default() += c.count;
        // Every state for every type, zeros included, like `totals`.
        by_type
            .entry(c.task_type)
            .or_insert_with(|| STATES.iter().map(|s| ((*s).to_owned(), 0)).collect())
            .insert(c.state, c.count);
    }
    let stats = Stats {
        dead: totals.get("dead").copied().unwrap_or(0),
        in_flight: health.processing,
        claimable: health.claimable,
        scheduled: health.scheduled,
        blocked: health.blocked,
        oldest_claimable_age_seconds: health.oldest_claimable_age_s,
        oldest_heartbeat_age_seconds: health.oldest_heartbeat_age_s,
        dead_tuples: health.table.dead_tuples,
        live_tuples: health.table.live_tuples,
        oldest_snapshot_age_seconds: health.table.oldest_snapshot_age_s,
        oldest_snapshot_holder: health.table.oldest_snapshot_holder,
        totals,
        by_type,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&stats).map_err(Failure::runtime)?
        );
        return Ok(());
    }
    print!("{:<28}", "task type");
    for s in STATES {
        print!("{s:>12}");
    }
    println!();
    for (task_type, states) in &stats.by_type {
        print!("{task_type:<28}");
        for s in STATES {
            print!("{:>12}", states.get(*s).copied().unwrap_or(0));
        }
        println!();
    }
    print!("{:<28}", "all");
    for s in STATES {
        print!("{:>12}", stats.totals.get(*s).copied().unwrap_or(0));
    }
    println!();
    println!(
        "\nclaimable now: {}   scheduled: {}   behind their ordering key: {}   in flight: {}   dead: {}   oldest claimable: {:.1}s",
        stats.claimable,
        stats.scheduled,
        stats.blocked,
        stats.in_flight,
        stats.dead,
        stats.oldest_claimable_age_seconds
    );
    println!(
        "task table: {} live rows, {} dead row versions   oldest open snapshot: {:.0}s{}",
        stats.live_tuples,
        stats.dead_tuples,
        stats.oldest_snapshot_age_seconds,
        stats
            .oldest_snapshot_holder
            .as_deref()
            .map(|h| format!(" ({h})"))
            .unwrap_or_default()
    );
    Ok(())
}
