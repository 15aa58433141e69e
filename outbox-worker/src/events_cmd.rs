//! `events emit | subscriptions | parked | retry | skip | rewind |
//! delete-subscription`: events from the command line, the subscriptions'
//! lag, and what operators do about parked aggregates and cursors.

use clap::{Args, Subcommand};
use outbox::events::{self, Event, new_event_id};

use crate::connect::{DbArgs, connect_operator_migrated};
use crate::failure::Failure;
use crate::flags;

/// `events` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
    /// Emit one event (committed at once) and print its id and position.
    Emit(EmitArgs),
    /// Every subscription (one per relay) with its lag: events of its
    /// stream not yet published, how long the oldest has waited, its live
    /// relay workers, and the events it holds back. Exits 1 when relays
    /// read nothing (the listing says why and the fix), so scripts and
    /// health checks see it.
    #[command(visible_alias = "backlog")]
    Subscriptions(ListArgs),
    /// One event (by position or id) and where each subscription reading
    /// its stream stands with it: passed (published), held back (and
    /// why), or waiting.
    Show(ShowArgs),
    /// Events held back because their aggregate is parked (the broker
    /// refused the first for good, or it is not due yet).
    Parked(ParkedArgs),
    /// Try a parked aggregate again now, from its first held-back event
    /// (`--now --event ID` also cuts its delay short), or every aggregate
    /// the broker refused (`--all`).
    Retry(RetryArgs),
    /// Drop a parked aggregate's first held-back event, named with
    /// `--event`, if the broker refused it or it waits for its delay, and
    /// publish the rest.
    Skip(SkipArgs),
    /// Delete a relay's subscription (its cursors and held-back events), so
    /// that retention stops waiting for it: for a relay taken out of
    /// service. Refused while a relay worker runs it.
    DeleteSubscription(DeleteArgs),
    /// Move a subscription's cursors back, to publish retained events
    /// again (a consumer lost its data), or forward, to pass a backlog no
    /// one wants. Its relay workers let its partitions go and take them
    /// again from there once their leases have run out. NATS JetStream
    /// drops events it stored within its duplicate window (10 minutes by
    /// default) as repeats; the relay warns when it does.
    Rewind(RewindArgs),
}

#[derive(Debug, Args)]
pub(crate) struct RewindArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The subscription (the relay's name).
    subscription: String,
    /// Where to: `start` (what the log keeps), `head` (past everything
    /// emitted so far), a position (that event and every later one) or an
    /// RFC 3339 time (every event emitted then or later).
    #[arg(long, value_name = "WHERE")]
    to: outbox::relay::Start,
}

#[derive(Debug, Args)]
pub(crate) struct DeleteArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The subscription (the relay's name).
    subscription: String,
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
    /// The payload as JSON; `-` reads it from standard input and `@FILE`
    /// from a file (at most 16 MiB either way).
    json: String,
    /// A header, as NAME=VALUE (repeatable).
    #[arg(long = "header", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// The event's id (a UUID); default: a new UUIDv7.
    #[arg(long)]
    id: Option<String>,
    /// The stream to emit to (the relays reading it publish it); default
    /// `events`.
    #[arg(long)]
    queue: Option<String>,
    /// Published no earlier than this from now (e.g. 30s, 5m; at most
    /// 365d); its aggregate's later events wait behind it.
    #[arg(allow_hyphen_values = true, long, value_parser = flags::duration(std::time::Duration::ZERO, outbox::events::MAX_EVENT_DELAY))]
    delay: Option<std::time::Duration>,
}

#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The event: its position in the log (digits), or its id (a UUID).
    event: String,
    /// For an id: how far from the time a UUIDv7 id carries to look (the
    /// last this long for another id). The log has no index on id, so the
    /// search reads the days' partitions in that window.
    #[arg(allow_hyphen_values = true, long, default_value = "1d", value_parser = flags::duration(std::time::Duration::from_secs(60), std::time::Duration::from_secs(400 * 86_400)))]
    within: std::time::Duration,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    db: DbArgs,
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ParkedArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Only this subscription's.
    #[arg(long)]
    subscription: Option<String>,
    /// At most this many events (1 to 100,000).
    #[arg(long, default_value_t = 100, value_parser = flags::count(1, 100_000))]
    limit: usize,
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct AggregateArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The subscription (the relay's name).
    subscription: String,
    /// The aggregate's type.
    aggregate_type: String,
    /// The aggregate's id.
    aggregate_id: String,
}

#[derive(Debug, Args)]
pub(crate) struct RetryArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The subscription (the relay's name).
    subscription: String,
    /// The aggregate's type (none with --all).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    aggregate_type: Option<String>,
    /// The aggregate's id (none with --all).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    aggregate_id: Option<String>,
    /// Every aggregate the broker refused, each from its first held-back
    /// event: after fixing what made the broker refuse them. Delayed
    /// aggregates keep their time.
    #[arg(long)]
    all: bool,
    /// With --all: only aggregates of this type.
    #[arg(long = "type", value_name = "AGGREGATE_TYPE", requires = "all")]
    of_type: Option<String>,
    /// Publish the first held-back event now even if its own delay
    /// (`emit --delay`) has not run out: for a delay given by mistake,
    /// which holds the aggregate's later events back with it. Needs
    /// --event.
    #[arg(long, conflicts_with = "all", requires = "event")]
    now: bool,
    /// With --now: the first held-back event's id, as `events parked`
    /// shows it. Only that one is published early: once it has gone out, a
    /// repeated --now does nothing (the next event's delay may be meant).
    #[arg(long, value_name = "EVENT_ID", value_parser = event_id, requires = "now")]
    event: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SkipArgs {
    #[command(flatten)]
    aggregate: AggregateArgs,
    /// The first held-back event, the one to drop (its id, as `events
    /// parked` shows it): the broker refused it, or it waits for its delay
    /// (it is then never published). A skip repeated, or made after the
    /// first event changed, drops nothing.
    #[arg(long, value_name = "EVENT_ID", value_parser = event_id)]
    event: String,
}

/// An event id as `events parked` prints it: a UUID, with or without its
/// hyphens.
fn event_id(s: &str) -> Result<String, String> {
    let digits: String = s.chars().filter(|c| *c != '-').collect();
    let grouped = s.len() == 36
        && s.char_indices()
            .all(|(i, c)| (c == '-') == matches!(i, 8 | 13 | 18 | 23));
    if digits.len() == 32
        && digits.chars().all(|c| c.is_ascii_hexdigit())
        && (grouped || s.len() == 32)
    {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not an event id (a UUID, as `events parked` shows it)"
        ))
    }
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
        EventsCommand::Subscriptions(args) => subscriptions(args).await,
        EventsCommand::Show(args) => show(args).await,
        EventsCommand::Parked(args) => parked(args).await,
        EventsCommand::Retry(args) => retry(args).await,
        EventsCommand::Skip(args) => act(args.aggregate, Action::Skip(args.event)).await,
        EventsCommand::DeleteSubscription(args) => delete_subscription(args).await,
        EventsCommand::Rewind(args) => rewind(args).await,
    }
}

async fn rewind(args: RewindArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 2).await?;
    let name = &args.subscription;
    match outbox::relay::rewind_subscription(&pool, name, args.to).await? {
        Some(position) => {
            // A position past the head gives the head (as a new
            // subscription's start there does): say so, rather than let a
            // mistyped position pass for the one asked.
            if let outbox::relay::Start::Position(asked) = args.to
                && asked - 1 > position
            {
                println!(
                    "position {asked} is past the log's head ({position}): the subscription \
                     goes to the head"
                );
            }
            println!(
                "subscription {name:?} now publishes the events after position {position}; \
                 its relay workers take its partitions again from there once the leases \
                 they held have run out"
            );
            Ok(())
        }
        None => Err(no_subscription(name)),
    }
}

async fn delete_subscription(args: DeleteArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 2).await?;
    let name = &args.subscription;
    match outbox::relay::delete_subscription(&pool, name).await? {
        outbox::relay::Deleted::Deleted { held_back } => {
            let dropped = match held_back {
                0 => String::new(),
                n => format!(" and the {n} event(s) it held back (never published by it)"),
            };
            println!("deleted subscription {name:?}{dropped}: retention no longer waits for it");
            Ok(())
        }
        outbox::relay::Deleted::Live => Err(Failure::runtime(format!(
            "relay {name:?} is running (a worker is alive on it, or a partition's lease has \
             not run out: after a rewind, a stopped worker's lease stays until its time, at \
             most the relay's lease): stop it first and try again once the lease has run out, \
             or it creates the subscription again and publishes the log from the start"
        ))),
        outbox::relay::Deleted::NotFound => Err(no_subscription(name)),
    }
}

async fn emit(args: EmitArgs) -> Result<(), Failure> {
    let (_, payload) = crate::payload::json(&args.json)?;
    let mut event = Event::new(
        args.aggregate_type,
        args.aggregate_id,
        args.event_type,
        payload,
    );
    let mut seen = std::collections::HashSet::new();
    for (name, value) in args.headers {
        // The last would win silently.
        if !seen.insert(name.to_ascii_lowercase()) {
            return Err(Failure::config(format!("header {name:?} is given twice")));
        }
        event = event.header(name, value);
    }
    if let Some(q) = &args.queue {
        event = event.queue(q.clone());
    }
    if let Some(d) = args.delay {
        event = event.delay(d);
    }
    let pool = connect_operator_migrated(&args.db, 2).await?;
    // Asked before the write, not after: once the event is committed,
    // nothing else the command does may wait on the database (a server
    // gone after the COMMIT would turn a written event into a timeout).
    let relays_stopped = outbox::relay::sequence_problem(&pool).await;
    // A stream of its own that no relay reads (a typo, or a relay not
    // set up yet): the event would wait unseen. Not the default stream: a
    // log read by Debezium instead of relays has no subscription at all,
    // and every emit would warn.
    let unread = match &args.queue {
        Some(q) if q != outbox::events::EVENTS_QUEUE => {
            outbox::relay::stream_has_subscription(&pool, q)
                .await
                .ok()
                .filter(|read| !read)
                .map(|_| q.clone())
        }
        _ => None,
    };
    // The id is chosen here, before the transaction, so a failure whose
    // outcome is unknown can name it, and a retry with it writes nothing
    // if the first try committed (emit_once).
    let id = args.id.unwrap_or_else(new_event_id);
    event = event.id(id.clone());
    let emitted = crate::commit::write_and_commit(
        &pool,
        async |conn| events::emit_once(conn, event).await,
        |_| crate::commit::Write {
            what: format!("event {id}"),
            retry: format!(
                "run the same command with --id {id}: it writes the event only if it was not"
            ),
        },
    )
    .await?;
    match emitted {
        Some(e) => println!("emitted event {} at position {}", e.id, e.position),
        None => println!("event {id} was emitted before: nothing written"),
    }
    // Relays that read nothing (see `events subscriptions`) will not
    // publish this event as things stand: say so, the write stands.
    if let Ok(Some(problem)) = relays_stopped {
        eprintln!("warning: relays read nothing: {problem}");
    }
    if let Some(stream) = unread {
        eprintln!(
            "warning: no subscription reads stream {stream:?} yet: the event waits in the log \
             for a relay with queue={stream} in its URL (up to the log's maximum age)"
        );
    }
    Ok(())
}

/// `events show`.
async fn show(args: ShowArgs) -> Result<(), Failure> {
    use outbox::relay::EventLookup;
    let lookup = match args.event.parse::<i64>() {
        Ok(p) if p > 0 => EventLookup::Position(p),
        Ok(_) => return Err(Failure::config("a position is 1 or more")),
        Err(_) => EventLookup::Id {
            id: event_id(&args.event).map_err(|_| {
                Failure::config(format!(
                    "{:?} is neither a position (1 or more) nor an event id (a UUID)",
                    args.event
                ))
            })?,
            window: args.within,
        },
    };
    let pool = connect_operator_migrated(&args.db, 2).await?;
    let Some(e) = outbox::relay::event_status(&pool, &lookup).await? else {
        let where_ = match lookup {
            EventLookup::Position(p) => format!("at position {p}"),
            EventLookup::Id { id, .. } => format!(
                "with id {id} within {} of its time (--within looks further)",
                flags::short(args.within)
            ),
        };
        return Err(Failure::runtime(format!(
            "the log has no event {where_}: never emitted, rolled back, or dropped by retention"
        )));
    };
    if args.json {
        return print_json(&e);
    }
    println!(
        "event {} at position {}: {}/{} {}, stream {}, emitted {}",
        e.id,
        e.position,
        e.aggregate_type,
        e.aggregate_id,
        e.event_type,
        e.stream,
        crate::when::at(e.created_at)
    );
    if let Some(at) = e.publish_at {
        println!("  delayed until {}", crate::when::at(at));
    }
    if let Some(h) = &e.headers {
        println!("  headers {h}");
    }
    println!(
        "  payload {}",
        e.payload
            .as_ref()
            .map_or_else(|| "null".to_owned(), ToString::to_string)
    );
    if e.subscriptions.is_empty() {
        println!("no subscription reads stream {:?}", e.stream);
    }
    for s in &e.subscriptions {
        let detail = match s.state.as_str() {
            "passed" => String::new(), // said once, below
            "held back" => {
                let why = s.error.as_deref().map_or_else(
                    || "its aggregate waits (a delay, or an event before it)".to_owned(),
                    |e| format!("refused: {e}"),
                );
                let when = s.retry_at.map_or_else(String::new, |t| {
                    format!("; tried again at {}", crate::when::at(t))
                });
                format!(": {why}{when} (see `events parked`)")
            }
            _ => " (not published yet)".to_owned(),
        };
        println!("{}: {}{detail}", s.subscription, s.state);
    }
    if e.subscriptions.iter().any(|s| s.state == "passed") {
        println!(
            "(passed: published, or passed over by a skip, a rewind or the subscription's start; \
             or emitted below the cursor while the position sequence was behind or cached, never \
             published: see the guide's \"Leave the position sequence alone\")"
        );
    }
    Ok(())
}

async fn subscriptions(args: ListArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 2).await?;
    let rows = outbox::relay::subscriptions(&pool).await?;
    let stopped = rows.iter().filter(|r| r.problem.is_some()).count();
    // With no subscription there is no row to carry the log's problem, and
    // the first relay started would read nothing: say so all the same.
    // (Unreadable for a role without rights on the sequence: then nothing
    // is said, as `events emit` says nothing.)
    let first_would_stop = if rows.is_empty() {
        outbox::relay::sequence_problem(&pool).await.ok().flatten()
    } else {
        None
    };
    let listed = if args.json {
        print_json(&rows)
    } else {
        print_subscriptions(rows);
        Ok(())
    };
    if stopped > 0 {
        return Err(Failure::runtime(format!(
            "the relays of {stopped} subscription(s) read nothing: see the listing for why and the fix"
        )));
    }
    if let Some(problem) = first_would_stop {
        return Err(Failure::runtime(format!(
            "relays would read nothing: {problem}"
        )));
    }
    listed
}

/// The subscriptions as a table, then what stops any of them.
fn print_subscriptions(rows: Vec<outbox::relay::Subscription>) {
    if rows.is_empty() {
        println!("no subscriptions: a relay creates its own when it first runs");
        return;
    }
    println!(
        "{:<20} {:<12} {:>5} {:>10} {:>9} {:>8} {:>12} {:>8} {:>10} {:>8}",
        "SUBSCRIPTION",
        "STREAM",
        "PARTS",
        "BEHIND",
        "LAG (s)",
        "WORKERS",
        "PUBLISHED",
        "PARKED",
        "AGGREGATES",
        "REFUSED"
    );
    for r in &rows {
        println!(
            "{:<20} {:<12} {:>5} {:>10} {:>9.1} {:>8} {:>12} {:>8} {:>10} {:>8}",
            r.name,
            r.stream,
            r.partitions,
            r.behind,
            r.lag_s,
            r.holders,
            r.published,
            r.parked,
            r.parked_aggregates,
            r.refused_aggregates
        );
    }
    for r in rows {
        if let Some(problem) = r.problem {
            println!("\n{}: its relay reads nothing: {problem}", r.name);
        }
        if let (Some(for_s), Some(why)) = (r.failing_s, r.failing) {
            println!(
                "\n{}: its publishes have failed for {for_s:.0} s, the last time: {why} \
                 (the relay tries again with backoff; events wait, none is lost)",
                r.name
            );
        }
    }
}

async fn parked(args: ParkedArgs) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 2).await?;
    let rows =
        outbox::relay::parked(&pool, args.subscription.as_deref(), args.limit as i64).await?;
    if rows.is_empty()
        && let Some(name) = &args.subscription
        && !outbox::relay::subscription_exists(&pool, name).await?
    {
        // An empty list would read as "nothing held back".
        return Err(no_subscription(name));
    }
    if args.json {
        return print_json(&rows);
    }
    if rows.is_empty() {
        println!("no events held back");
        return Ok(());
    }
    println!(
        "{:<16} {:<24} {:>10} {:<36} {:<20} {:<25} ERROR",
        "SUBSCRIPTION", "AGGREGATE", "POSITION", "EVENT ID", "TYPE", "RETRY AT"
    );
    // The rows come aggregate by aggregate, each one's first first: only
    // that one has a time of its own; the others wait behind it.
    let mut first: Option<(String, String, String, i64)> = None;
    for r in rows {
        let retry = match &first {
            Some((sub, t, i, at))
                if (sub, t, i) == (&r.subscription, &r.aggregatetype, &r.aggregateid) =>
            {
                format!("(behind {at})")
            }
            _ => {
                first = Some((
                    r.subscription.clone(),
                    r.aggregatetype.clone(),
                    r.aggregateid.clone(),
                    r.position,
                ));
                r.retry_at
                    .map_or_else(|| "(operator)".to_owned(), crate::when::at)
            }
        };
        println!(
            "{:<16} {:<24} {:>10} {:<36} {:<20} {:<25} {}",
            r.subscription,
            format!("{}/{}", r.aggregatetype, r.aggregateid),
            r.position,
            r.id,
            r.event_type,
            retry,
            r.error.unwrap_or_default()
        );
    }
    Ok(())
}

/// `events retry`: one aggregate, or with `--all` every refused one.
async fn retry(args: RetryArgs) -> Result<(), Failure> {
    let (Some(aggregate_type), Some(aggregate_id)) = (args.aggregate_type, args.aggregate_id)
    else {
        return retry_all(args.db, &args.subscription, args.of_type.as_deref()).await;
    };
    let aggregate = AggregateArgs {
        db: args.db,
        subscription: args.subscription,
        aggregate_type,
        aggregate_id,
    };
    act(aggregate, Action::Retry { now: args.event }).await
}

/// `events retry SUBSCRIPTION --all`.
async fn retry_all(db: DbArgs, sub: &str, of_type: Option<&str>) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&db, 2).await?;
    let retried = outbox::relay::retry_all_parked(&pool, sub, of_type).await?;
    if retried == 0 && !outbox::relay::subscription_exists(&pool, sub).await? {
        return Err(no_subscription(sub));
    }
    let which = of_type.map_or_else(String::new, |t| format!(" of type {t:?}"));
    println!("{sub} tries {retried} refused aggregate(s){which} again now");
    Ok(())
}

/// What an operator does to a parked aggregate.
enum Action {
    /// Try it again; `now` names its first event, to cut its delay short.
    Retry { now: Option<String> },
    /// Skip its first event, only if it is the one named.
    Skip(String),
}

/// Retries a parked aggregate, or skips its first event.
async fn act(args: AggregateArgs, action: Action) -> Result<(), Failure> {
    let pool = connect_operator_migrated(&args.db, 2).await?;
    let (sub, t, i) = (&args.subscription, &args.aggregate_type, &args.aggregate_id);
    let id = match &action {
        Action::Skip(event) => outbox::relay::skip_parked_event(&pool, sub, t, i, event).await?,
        Action::Retry { now: None } => outbox::relay::retry_parked(&pool, sub, t, i).await?,
        Action::Retry { now: Some(event) } => {
            outbox::relay::retry_parked_now(&pool, sub, t, i, event).await?
        }
    };
    if id.is_none() && !outbox::relay::subscription_exists(&pool, sub).await? {
        return Err(no_subscription(sub));
    }
    match (id, action) {
        (Some(id), Action::Skip(_)) => println!(
            "skipped event {id} of {t}/{i} for {sub}; the rest of its events are published next"
        ),
        (Some(id), Action::Retry { now: Some(_) }) => {
            println!("{sub} publishes {t}/{i} now, from event {id}, whatever its delay");
        }
        (Some(id), Action::Retry { now: None }) => {
            // A delay is the emitter's: a retry does not cut it short.
            let delayed = outbox::relay::delayed_until(&pool, sub, &id).await?;
            match delayed {
                Some(at) => println!(
                    "{sub} holds {t}/{i} back until {}: its first event {id} is delayed until then (a retry does not cut a delay short; `--now` does)",
                    crate::when::at(at)
                ),
                None => println!("{sub} tries {t}/{i} again now, from event {id}"),
            }
        }
        (None, Action::Skip(event)) => {
            return Err(Failure::runtime(format!(
                "skipped nothing: subscription {sub:?} holds nothing back for {t}/{i}, or the first event it holds back is not event {event}, refused or delayed (see `events parked`)"
            )));
        }
        (None, Action::Retry { now: Some(event) }) => {
            return Err(Failure::runtime(format!(
                "published nothing early: subscription {sub:?} holds nothing back for {t}/{i}, or the first event it holds back is not event {event} (see `events parked`)"
            )));
        }
        (None, Action::Retry { now: None }) => {
            return Err(Failure::runtime(format!(
                "subscription {sub:?} holds nothing back for aggregate {t}/{i} (see `events parked`)"
            )));
        }
    }
    Ok(())
}

/// Prints `rows` as one JSON array.
fn print_json(rows: &impl serde::Serialize) -> Result<(), Failure> {
    println!("{}", serde_json::to_string(rows).map_err(Failure::runtime)?);
    Ok(())
}

/// The refusal for a subscription that does not exist.
fn no_subscription(name: &str) -> Failure {
    Failure::runtime(format!(
        "there is no subscription {name:?} (see `events subscriptions`)"
    ))
}
