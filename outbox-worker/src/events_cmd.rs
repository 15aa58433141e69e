//! `events emit | backlog | debezium`: events from the command line, the
//! relays' backlog, and the Debezium mirror switch.

use clap::{Args, Subcommand, ValueEnum};
use outbox::events::{self, Event};

use crate::connect::{DbArgs, connect_migrated};
use crate::failure::Failure;

/// `events` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
    /// Emit one event (committed at once) and print its task id and event id.
    Emit(EmitArgs),
    /// Events not yet published, per queue: waiting, oldest age, dead, and
    /// aggregates blocked by a dead event.
    Backlog(BacklogArgs),
    /// Turn the Debezium mirror on or off, or show it: while on, each event
    /// is also written to `outbox_events` (id, aggregatetype, aggregateid,
    /// type, payload) in the emitting transaction.
    Debezium(DebeziumArgs),
}

#[derive(Debug, Args)]
pub(crate) struct EmitArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The aggregate's type (routing, and half the ordering key).
    aggregate_type: String,
    /// The aggregate's id (the message key).
    aggregate_id: String,
    /// The event's type.
    event_type: String,
    /// The payload, as JSON.
    json: String,
    /// A header, as NAME=VALUE (repeatable).
    #[arg(long = "header", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// The event's id (a UUID); default: derived from its task id.
    #[arg(long)]
    id: Option<String>,
    /// The queue (the relay) to emit to; default `events`.
    #[arg(long)]
    queue: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct BacklogArgs {
    #[command(flatten)]
    db: DbArgs,
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct DebeziumArgs {
    #[command(flatten)]
    db: DbArgs,
    /// on, off, or status.
    #[arg(value_enum)]
    switch: Switch,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Switch {
    On,
    Off,
    Status,
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE (for example tenant=acme)"))?;
    Ok((name.to_owned(), value.to_owned()))
}

pub(crate) async fn run(command: EventsCommand) -> Result<(), Failure> {
    match command {
        EventsCommand::Emit(args) => emit(args).await,
        EventsCommand::Backlog(args) => backlog(args).await,
        EventsCommand::Debezium(args) => debezium(args).await,
    }
}

async fn emit(args: EmitArgs) -> Result<(), Failure> {
    let payload: serde_json::Value = serde_json::from_str(&args.json)
        .map_err(|e| Failure::config(format!("the payload is not JSON: {e}")))?;
    let mut event = Event::new(
        args.aggregate_type,
        args.aggregate_id,
        args.event_type,
        payload,
    );
    for (name, value) in args.headers {
        event = event.header(name, value);
    }
    if let Some(id) = args.id {
        event = event.id(id);
    }
    if let Some(q) = args.queue {
        event = event.queue(q);
    }
    let pool = connect_migrated(&args.db.database_url, 2).await?;
    let mut conn = pool.acquire().await.map_err(outbox::Error::from)?;
    let task = events::emit(&mut conn, event).await?;
    let id = events::event_id(&mut conn, task).await?.unwrap_or_default();
    println!("emitted event {id} as task {task}");
    Ok(())
}

async fn backlog(args: BacklogArgs) -> Result<(), Failure> {
    let pool = connect_migrated(&args.db.database_url, 2).await?;
    let rows = outbox::relay::backlog(&pool).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&rows).map_err(Failure::runtime)?
        );
        return Ok(());
    }
    if rows.is_empty() {
        println!("no events waiting");
        return Ok(());
    }
    println!(
        "{:<20} {:>10} {:>14} {:>8} {:>13}",
        "QUEUE", "WAITING", "OLDEST AGE (s)", "DEAD", "BLOCKED KEYS"
    );
    for r in rows {
        println!(
            "{:<20} {:>10} {:>14.1} {:>8} {:>13}",
            r.queue, r.pending, r.oldest_age_s, r.dead, r.blocked_keys
        );
    }
    Ok(())
}

async fn debezium(args: DebeziumArgs) -> Result<(), Failure> {
    let pool = connect_migrated(&args.db.database_url, 2).await?;
    match args.switch {
        Switch::On => events::set_debezium_mirror(&pool, true).await?,
        Switch::Off => events::set_debezium_mirror(&pool, false).await?,
        Switch::Status => {}
    }
    let on = events::debezium_mirror(&pool).await?;
    println!(
        "the Debezium mirror is {}",
        if on {
            "on: events are also written to outbox_events"
        } else {
            "off"
        }
    );
    Ok(())
}
