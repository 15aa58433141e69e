//! `bench --relay KIND`: what a relay publishes per second from the event
//! log, and how long an event takes from its commit to the broker's
//! acknowledgement.
//!
//! The broker is started here on a free loopback port (nats-server with
//! JetStream, redis-server with `appendfsync always`) or, for webhooks, an
//! in-process HTTP receiver that answers 204; `--relay-url` points at a
//! running broker instead. Each phase starts on an empty log with a new
//! subscription. Phases:
//! 1. `--relay-events` events over as many aggregates, then one relay
//!    worker drains them: events/s;
//! 2. the same over 1,000 aggregates, each in strict order: events/s;
//! 3. the same events drained by two subscriptions at once (each to the
//!    broker): how much longer than one;
//! 4. `--relay-delayed-events` events over as many aggregates, each
//!    delayed to one moment a little ahead (`Event::delay`): the relay
//!    holds them back, then publishes them when they are due: events/s
//!    from that moment, against phase 1's rate. Before them,
//!    `--relay-parked-events` events delayed an hour are parked (and a
//!    new relay worker takes the partition over), so that the relay's
//!    looks at what it holds back have a long list to look through;
//! 5. emit `--relay-events` and drain them with one subscription, again
//!    and again for `--relay-held-seconds`, then as long again while
//!    another session holds a snapshot open: emit and drain rates with the
//!    snapshot against without it;
//! 6. events emitted one per transaction at `--relay-rate` per second for
//!    `--relay-seconds` while the relay runs: commit-to-ack p50/p99;
//! 7. retention: a day of `--relay-drop-events` events, every subscription
//!    past it, dropped whole: how long the drop took, and the log's dead
//!    row versions (none: nothing in it is updated or deleted).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use outbox::events::{Event, emit, emit_all};
use outbox::relay::{Message, PublishError, PublishFuture, Relay, Sink};
use outbox::{Worker, WorkerConfig};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{
    Bench, Latency, cpu_seconds, db, machine_cores, machine_cpu_seconds,
    without_and_with_a_held_snapshot,
};
use crate::connect::connect_bench;
use crate::failure::Failure;
use crate::flags;
use crate::local_broker::{BrokerProcess, Kind, find_binary};

/// `bench --relay` flags.
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// Benchmark a relay instead of the task engine, against a broker
    /// started here (nats, redis) or an in-process receiver (webhook).
    #[arg(long = "relay", value_enum)]
    pub(crate) relay: Option<RelayKind>,
    /// A running broker to use instead (the relay URL, as for `run
    /// --relay`); its kind must match --relay. Its route is kept: on NATS
    /// or Redis, give it one the two-subscription drain cannot share (it
    /// routes both to the same destination, where the second's copies are
    /// dropped as repeats).
    #[arg(long)]
    relay_url: Option<String>,
    /// Events in each throughput phase.
    #[arg(long, default_value_t = 50_000, value_parser = flags::count(1, 10_000_000))]
    relay_events: usize,
    /// The relay's concurrency (aggregates publishing at once); default:
    /// the sink's (1,024 for Kafka, 256 for the others).
    #[arg(long, value_parser = flags::count(1, outbox::MAX_CONCURRENCY as u64))]
    relay_concurrency: Option<usize>,
    /// Events in the retention phase's day (0 skips it).
    #[arg(long, default_value_t = 1_000_000, value_parser = flags::count(0, 100_000_000))]
    relay_drop_events: usize,
    /// Events in the delayed-events phase, each its own aggregate, all due
    /// at one moment (0 skips it).
    #[arg(long, default_value_t = 20_000, value_parser = flags::count(0, 10_000_000))]
    relay_delayed_events: usize,
    /// Events delayed an hour, each its own aggregate, held back before
    /// the delayed-events phase: the list the relay looks through while
    /// the phase's events come due.
    #[arg(long, default_value_t = 100_000, value_parser = flags::count(0, 10_000_000))]
    relay_parked_events: usize,
    /// Events per second in the latency phase.
    #[arg(long, default_value_t = 1000, value_parser = flags::count(1, 100_000))]
    relay_rate: usize,
    /// How long the latency phase emits.
    #[arg(long, default_value_t = 10, value_parser = flags::count(1, 3600))]
    relay_seconds: usize,
    /// How long the held-snapshot phase emits and drains, without the
    /// snapshot and then again with it (the target is judged at 300).
    #[arg(long, default_value_t = 5, value_parser = flags::count(1, 3600))]
    relay_held_seconds: usize,
}

/// A broker kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RelayKind {
    Nats,
    Redis,
    Rabbitmq,
    Webhook,
    /// librdkafka's mock cluster, in process (3 brokers, the real
    /// protocol, logs in memory).
    Kafka,
}

/// What `bench --relay` measured.
#[derive(Debug, Serialize)]
pub(crate) struct RelayReport {
    relay: RelayKind,
    concurrency: usize,
    events: usize,
    /// Each event its own aggregate.
    events_per_s: f64,
    /// 1,000 aggregates, each in strict order.
    ordered_1000_keys_events_per_s: f64,
    /// Over the rate of one event per aggregate: the target is 0.9 or more.
    ordered_vs_unordered: f64,
    /// Two subscriptions draining the same events at once, in seconds,
    /// over one: the target is 1.3 or less.
    two_subscriptions_time_ratio: f64,
    /// The least that ratio could be on this machine for the CPU time the
    /// two subscriptions' drain used (all of it, and all but the relay's):
    /// its cores fully busy for the whole drain. See [`cpu_floor`].
    two_subscriptions_cpu_floor: Option<f64>,
    two_subscriptions_cpu_floor_without_relay: Option<f64>,
    /// CPU per event published in each drain (two subscriptions publish
    /// every event twice: per publish).
    drain_cpu_per_event: DrainCpu,
    /// Delayed events, all due at once, each its own aggregate: published
    /// per second from the moment they came due (null when skipped), and
    /// over `events_per_s`.
    delayed_events: usize,
    /// Events held back an hour ahead meanwhile.
    parked_events: usize,
    delayed_events_per_s: Option<f64>,
    delayed_vs_unordered: Option<f64>,
    /// Phase 1's emits per second (transactions of 1,000).
    emit_events_per_s: f64,
    /// Rounds of emit and drain without, then with, another session
    /// holding a snapshot open: the rates and ratios (target 0.9+).
    snapshot_held: SnapshotHeld,
    /// Emitted one per transaction at this rate.
    latency_rate_per_s: usize,
    /// From the emitting transaction's commit returning to the broker's ack.
    commit_to_ack_ms: Latency,
    /// Emit in the business transaction, against a plain row.
    emit: Option<super::business::EmitReport>,
    /// The retention phase: events in the day, the drop's milliseconds, and
    /// the log's dead row versions after every phase.
    drop_events: usize,
    drop_ms: f64,
    log_dead_tuples: i64,
}

/// Phase 5's figures.
#[derive(Debug, Serialize)]
struct SnapshotHeld {
    held_seconds: f64,
    free: Rounds,
    held: Rounds,
    emit_ratio: f64,
    drain_ratio: f64,
    /// The last round's drain with the snapshot over the last without:
    /// where a cost that grows with the snapshot's age shows.
    last_drain_ratio: f64,
}

/// Rounds of emit and drain of one subscription.
#[derive(Debug, Serialize)]
struct Rounds {
    rounds: usize,
    emit_events_per_s: f64,
    drain_events_per_s: f64,
    last_drain_events_per_s: f64,
}

/// A sink that notes when each of the latency phase's events was
/// acknowledged.
struct Timed {
    inner: Arc<dyn Sink>,
    acked: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Sink for Timed {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn default_concurrency(&self) -> usize {
        self.inner.default_concurrency()
    }

    fn check(&self, message: &Message) -> Result<(), PublishError> {
        self.inner.check(message)
    }

    fn check_route(&self, route: &outbox::relay::Route) -> Result<(), String> {
        self.inner.check_route(route)
    }

    fn unreachable(&self) -> Option<String> {
        self.inner.unreachable()
    }

    fn preflight<'a>(
        &'a self,
        route: &'a outbox::relay::Route,
    ) -> outbox::relay::PreflightFuture<'a> {
        self.inner.preflight(route)
    }

    fn publish<'a>(&'a self, message: &'a Message) -> PublishFuture<'a> {
        Box::pin(async move {
            self.inner.publish(message).await?;
            if message.event_id.starts_with(LATENCY_IDS) {
                self.acked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(message.event_id.clone())
                    .or_insert_with(Instant::now);
            }
            Ok(())
        })
    }
}

/// The broker of the run, kept alive while it lasts.
enum Running {
    Process(BrokerProcess),
    #[cfg(feature = "kafka")]
    Kafka(
        #[expect(
            dead_code,
            reason = "held so the mock cluster lives as long as the run"
        )]
        rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    ),
    Receiver(tokio::task::JoinHandle<()>),
    External,
}

/// How the latency phase's event ids start (the only events whose
/// acknowledgements are timed one by one).
const LATENCY_IDS: &str = "00000000-0000-4000-8000-";

pub(crate) async fn measure(bench: &Bench, kind: RelayKind) -> Result<RelayReport, Failure> {
    let args = &bench.args.relay;
    let (url, broker) = match &args.relay_url {
        Some(url) => (url.clone(), Running::External),
        None => start_broker(kind).await?,
    };
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let subscriptions = AtomicUsize::new(0);
    let make = async || -> Result<Relay, Failure> {
        let acked = Arc::clone(&acked);
        // A new subscription each time, from the start of the log.
        let name = format!("bench{}", subscriptions.fetch_add(1, Ordering::Relaxed));
        let relay = match &broker {
            // guest's password would have to come from the environment.
            #[cfg(feature = "rabbitmq")]
            Running::Process(server) if kind == RelayKind::Rabbitmq => Relay::new(
                name.clone(),
                outbox::relay::rabbitmq::RabbitSink::new(
                    &format!("amqp://guest:guest@127.0.0.1:{}/%2f", server.port),
                    "outbox",
                )
                .declare_exchange("topic")
                .map_err(Failure::config)?
                .bind_queue("bench"),
            ),
            _ => Relay::from_url(&name, &url)
                .await
                .map_err(Failure::config)?,
        };
        let relay = match args.relay_concurrency {
            Some(c) => relay.concurrency(c),
            None => relay,
        };
        // NATS and Redis drop an event already stored at its destination
        // (by the event id and the subject or stream): each subscription
        // gets destinations of its own on a broker started here, or the
        // second of two draining the same events would only be
        // acknowledged as repeats. A broker given by URL keeps its route.
        let relay = match (kind, &broker) {
            (RelayKind::Nats | RelayKind::Redis, Running::Process(_)) => {
                relay.route(&format!("outbox.{name}.{{aggregate_type}}"))
            }
            _ => relay,
        };
        Ok(relay.wrap_sink(move |inner| Arc::new(Timed { inner, acked })))
    };
    let n = args.relay_events;
    // Made first: a build without this sink says so before the minutes of
    // the emit phase.
    let first = make().await?;
    let emit = super::business::measure_emit(bench).await?;
    let concurrency = first.concurrency_limit();
    bench.say(format!(
        "relay {kind:?}: {n} events per throughput phase, concurrency {concurrency}"
    ));

    reset(bench).await?;
    let emit_rate = fill(bench, n, |i| i.to_string()).await?;
    let broker_pid = match &broker {
        Running::Process(server) => server.pid(),
        _ => None,
    };
    let own = drain(bench, &[first], n, broker_pid).await?;
    let events_per_s = own.events_per_s;
    bench.say(format!(
        "  each event its own aggregate: {events_per_s:.0} events/s (emitted at {emit_rate:.0}/s; {})",
        own.cpu
    ));

    reset(bench).await?;
    fill(bench, n, |i| (i % 1000).to_string()).await?;
    let in_order = drain(bench, &[make().await?], n, broker_pid).await?;
    let ordered = in_order.events_per_s;
    bench.say(format!(
        "  1,000 aggregates in strict order: {ordered:.0} events/s ({:.2}x; {})",
        ordered / events_per_s.max(1e-9),
        in_order.cpu
    ));

    // Two subscriptions on the same events, at once: each drains all of
    // them (2n publishes), timed against one subscription's n.
    let both = drain(bench, &[make().await?, make().await?], 2 * n, broker_pid).await?;
    let two = both.events_per_s;
    let one_seconds = n as f64 / ordered.max(1e-9);
    let two_ratio = (2.0 * n as f64 / two) / one_seconds;
    let cores = machine_cores();
    let floor = cpu_floor(both.cpu.machine_us, 2 * n, one_seconds, cores);
    let floor_without_relay = cpu_floor(
        both.cpu
            .machine_us
            .zip(both.cpu.relay_us)
            .map(|(m, r)| m - r),
        2 * n,
        one_seconds,
        cores,
    );
    let shown = |v: Option<f64>| v.map_or_else(|| "?".to_owned(), |v| format!("{v:.2}x"));
    bench.say(format!(
        "  two subscriptions at once: {:.2} s against one's {one_seconds:.2} s ({two_ratio:.2}x; {}); \
         the CPU time it took needs at least {} on {} cores, without the relay's own {}",
        2.0 * n as f64 / two,
        both.cpu,
        shown(floor),
        cores,
        shown(floor_without_relay),
    ));

    let delayed_events = args.relay_delayed_events;
    let delayed = if delayed_events > 0 {
        reset(bench).await?;
        let parked = args.relay_parked_events;
        let relay = make().await?;
        if parked > 0 {
            park_ahead(bench, relay.clone(), parked).await?;
        }
        let drained = delayed(bench, relay, delayed_events, emit_rate, broker_pid).await?;
        bench.say(format!(
            "  {delayed_events} delayed events due at once, {parked} more held back an hour: \
             {:.0} events/s from then ({:.2}x; {})",
            drained.events_per_s,
            drained.events_per_s / events_per_s.max(1e-9),
            drained.cpu
        ));
        Some(drained.events_per_s)
    } else {
        None
    };

    // A snapshot held open by another session (a long report, a stuck
    // transaction): nothing in the log is updated, so nothing waits on it.
    // One subscription throughout, so that what its cursor's row and the
    // log gather while the snapshot is held counts.
    reset(bench).await?;
    let snapshot_held = snapshot_held(bench, make().await?, n).await?;
    bench.say(format!(
        "  with a snapshot held open {:.0} s: emit {:.0}/s ({:.2}x), drain {:.0}/s ({:.2}x; the last \
         round {:.2}x) over {} rounds, against {} without it",
        snapshot_held.held_seconds,
        snapshot_held.held.emit_events_per_s,
        snapshot_held.emit_ratio,
        snapshot_held.held.drain_events_per_s,
        snapshot_held.drain_ratio,
        snapshot_held.last_drain_ratio,
        snapshot_held.held.rounds,
        snapshot_held.free.rounds,
    ));

    acked.lock().unwrap_or_else(|p| p.into_inner()).clear();
    reset(bench).await?;
    let latency = latency(bench, make().await?, &acked).await?;
    bench.say(format!(
        "  commit to ack at {} events/s: {latency}",
        args.relay_rate
    ));
    drop(broker);
    let log_dead_tuples: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables WHERE relname LIKE 'outbox_event_log%'",
    )
    .fetch_one(&bench.pool)
    .await
    .map_err(db)?;
    let drop_events = args.relay_drop_events;
    let drop_ms = if drop_events > 0 {
        let ms = retention(bench, drop_events).await?;
        bench.say(format!(
            "  retention: a day of {drop_events} events dropped in {ms:.0} ms; {log_dead_tuples} dead row versions in the log"
        ));
        ms
    } else {
        0.0
    };
    Ok(RelayReport {
        relay: kind,
        concurrency,
        events: n,
        events_per_s,
        ordered_1000_keys_events_per_s: ordered,
        ordered_vs_unordered: ordered / events_per_s.max(1e-9),
        two_subscriptions_time_ratio: two_ratio,
        two_subscriptions_cpu_floor: floor,
        two_subscriptions_cpu_floor_without_relay: floor_without_relay,
        delayed_events,
        parked_events: args.relay_parked_events,
        delayed_events_per_s: delayed,
        delayed_vs_unordered: delayed.map(|d| d / events_per_s.max(1e-9)),
        drain_cpu_per_event: DrainCpu {
            each_event_its_own_aggregate: own.cpu,
            ordered_1000_keys: in_order.cpu,
            two_subscriptions: both.cpu,
        },
        emit_events_per_s: emit_rate,
        snapshot_held,
        latency_rate_per_s: args.relay_rate,
        commit_to_ack_ms: latency,
        emit,
        drop_events,
        drop_ms,
        log_dead_tuples,
    })
}

/// Phase 5: rounds of `n` events emitted and drained by `relay` for
/// `--relay-held-seconds`, then as long again while another session holds
/// a snapshot open.
async fn snapshot_held(bench: &Bench, relay: Relay, n: usize) -> Result<SnapshotHeld, Failure> {
    let seconds = Duration::from_secs(bench.args.relay.relay_held_seconds as u64);
    let (free, held, held_seconds) = without_and_with_a_held_snapshot(
        &bench.pool,
        "SELECT count(*) FROM outbox_event_cursors",
        async || rounds(bench, &relay, n, seconds).await,
    )
    .await?;
    let ratio = |a: f64, b: f64| a / b.max(1e-9);
    Ok(SnapshotHeld {
        held_seconds,
        emit_ratio: ratio(held.emit_events_per_s, free.emit_events_per_s),
        drain_ratio: ratio(held.drain_events_per_s, free.drain_events_per_s),
        last_drain_ratio: ratio(held.last_drain_events_per_s, free.last_drain_events_per_s),
        free,
        held,
    })
}

/// Emits `n` events and drains them with `relay`, again and again until
/// `at_least` has passed (once at least).
async fn rounds(
    bench: &Bench,
    relay: &Relay,
    n: usize,
    at_least: Duration,
) -> Result<Rounds, Failure> {
    let started = Instant::now();
    let (mut rounds, mut emit_s, mut drain_s) = (0, 0.0, 0.0);
    let mut last = 0.0;
    while rounds == 0 || started.elapsed() < at_least {
        emit_s += n as f64 / fill(bench, n, |i| i.to_string()).await?;
        last = drain(bench, std::slice::from_ref(relay), n, None)
            .await?
            .events_per_s;
        drain_s += n as f64 / last;
        rounds += 1;
    }
    let events = (rounds * n) as f64;
    Ok(Rounds {
        rounds,
        emit_events_per_s: events / emit_s,
        drain_events_per_s: events / drain_s,
        last_drain_events_per_s: last,
    })
}

/// Fills a day's partition (a day ahead, so nothing else lands there) with
/// `n` events, moves a subscription past them, and times the maintenance
/// leader's statement that drops it.
async fn retention(bench: &Bench, n: usize) -> Result<f64, Failure> {
    reset(bench).await?;
    let day = chrono::Utc::now() - chrono::Duration::days(3);
    sqlx::query("SELECT outbox_event_log_cover($1, interval '1 day')")
        .bind(day)
        .execute(&bench.pool)
        .await
        .map_err(db)?;
    sqlx::query(
        "INSERT INTO outbox_event_log (id, aggregatetype, aggregateid, type, payload, created_at)
         SELECT gen_random_uuid(), 'order', (g % 1000)::text, 'order.updated', '{}'::jsonb,
                date_trunc('day', $2::timestamptz) + interval '1 hour'
         FROM generate_series(1, $1) AS g",
    )
    .bind(n as i64)
    .bind(day)
    .execute(&bench.pool)
    .await
    .map_err(db)?;
    // A subscription whose cursor is past everything.
    sqlx::raw_sql(
        "INSERT INTO outbox_event_subscriptions (name, stream, partitions) VALUES ('drop', 'events', 1);
         INSERT INTO outbox_event_cursors (subscription, part, position)
         VALUES ('drop', 0, coalesce(pg_sequence_last_value('outbox_event_position_seq'), 0));",
    )
    .execute(&bench.pool)
    .await
    .map_err(db)?;
    bench.checkpoint().await;
    let started = Instant::now();
    let dropped: Option<String> = sqlx::query_scalar(
        "SELECT dropped FROM outbox_event_log_drop(now() - interval '1 hour', now() - interval '30 days')",
    )
    .fetch_one(&bench.pool)
    .await
    .map_err(db)?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    if dropped.is_none() {
        return Err(Failure::runtime(
            "the retention phase's day was not dropped",
        ));
    }
    reset(bench).await?;
    Ok(ms)
}

/// Starts a broker of `kind`; returns the relay URL.
async fn start_broker(kind: RelayKind) -> Result<(String, Running), Failure> {
    let local = match kind {
        RelayKind::Nats => Kind::Nats,
        RelayKind::Redis => Kind::Redis,
        RelayKind::Rabbitmq => Kind::Rabbitmq,
        RelayKind::Webhook => return webhook_receiver().await,
        RelayKind::Kafka => return kafka_mock(),
    };
    let (name, candidates) = local.binary();
    let binary = find_binary(name, candidates).ok_or_else(|| {
        Failure::config(format!(
            "{name} is not installed: install it (bash .ci/install-brokers) or give --relay-url"
        ))
    })?;
    let server = local.start(&binary).await;
    let url = match local {
        // Every subscription's subjects (see `make`).
        Kind::Nats => format!(
            "{}?stream=BENCH&stream_subjects=outbox.>",
            local.url(&server)
        ),
        // The exchange and a queue taking every event, declared by the
        // sink (a returned message would be refused for good).
        Kind::Rabbitmq => format!(
            "{}?exchange_type=topic&bind_queue=bench",
            local.url(&server)
        ),
        Kind::Redis => local.url(&server),
    };
    Ok((url, Running::Process(server)))
}

/// librdkafka's mock cluster, with the orders' topic on four partitions.
#[cfg(feature = "kafka")]
fn kafka_mock() -> Result<(String, Running), Failure> {
    let cluster = rdkafka::mocking::MockCluster::new(3).map_err(Failure::runtime)?;
    cluster
        .create_topic("outbox.event.order", 4, 3)
        .map_err(Failure::runtime)?;
    Ok((
        format!("kafka://{}", cluster.bootstrap_servers()),
        Running::Kafka(cluster),
    ))
}

#[cfg(not(feature = "kafka"))]
fn kafka_mock() -> Result<(String, Running), Failure> {
    Err(Failure::config(
        "this build has no Kafka sink (cargo feature \"kafka\")",
    ))
}

/// An in-process HTTP receiver answering 204.
async fn webhook_receiver() -> Result<(String, Running), Failure> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(Failure::runtime)?;
    let port = listener.local_addr().map_err(Failure::runtime)?.port();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(|| async { axum::http::StatusCode::NO_CONTENT }),
    );
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((
        format!("http://127.0.0.1:{port}/hook"),
        Running::Receiver(server),
    ))
}

impl Drop for Running {
    fn drop(&mut self) {
        match self {
            Running::Process(server) => server.kill(),
            Running::Receiver(server) => server.abort(),
            #[cfg(feature = "kafka")]
            Running::Kafka(_) => {}
            Running::External => {}
        }
    }
}

/// Empties the log and forgets the subscriptions, and flushes it to disk:
/// each phase starts on an empty log, not behind the last one's writes.
async fn reset(bench: &Bench) -> Result<(), Failure> {
    for sql in [
        "TRUNCATE outbox_event_log",
        "DELETE FROM outbox_event_subscriptions",
        "VACUUM ANALYZE outbox_event_cursors",
    ] {
        sqlx::query(sql).execute(&bench.pool).await.map_err(db)?;
    }
    bench.checkpoint().await;
    Ok(())
}

/// Emits `n` events, event `i` on aggregate `key(i)`, in transactions of
/// 1,000; events/s.
async fn fill(bench: &Bench, n: usize, key: impl Fn(usize) -> String) -> Result<f64, Failure> {
    fill_with(bench, n, |j| {
        Event::new(
            "order",
            key(j),
            "order.updated",
            serde_json::json!({"n": j}),
        )
    })
    .await
}

/// Emits `n` events, event `i` made by `event(i)`, in transactions of
/// 1,000; events/s.
async fn fill_with(
    bench: &Bench,
    n: usize,
    event: impl Fn(usize) -> Event,
) -> Result<f64, Failure> {
    let started = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + 1000).min(n);
        let mut tx = bench.pool.begin().await.map_err(db)?;
        emit_all(&mut tx, (i..end).map(&event)).await?;
        tx.commit().await.map_err(db)?;
        i = end;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Phase 4: `n` events over as many aggregates, emitted in transactions
/// of 1,000 with delays that make them all due at one moment (far enough
/// ahead for the emits at `emit_rate` and the relay holding them back),
/// then drained by `relay`: its rate from that moment.
async fn delayed(
    bench: &Bench,
    relay: Relay,
    n: usize,
    emit_rate: f64,
    broker: Option<u32>,
) -> Result<Drained, Failure> {
    let ahead = Duration::from_secs_f64(1.5 + 2.0 * n as f64 / emit_rate.max(1.0));
    let due = Instant::now() + ahead;
    fill_with(bench, n, |j| {
        Event::new(
            "order",
            format!("d{j}"),
            "order.reminded",
            serde_json::json!({"n": j}),
        )
        .delay(due.saturating_duration_since(Instant::now()))
    })
    .await?;
    if Instant::now() >= due {
        bench.say(format!(
            "  (the delayed events took longer to emit than the {ahead:?} allowed: some were due before the relay started)"
        ));
    }
    drain_from(bench, &[relay], n, broker, Some(due)).await
}

/// Before phase 4: `n` events over as many aggregates, delayed an hour,
/// which a relay worker running `relay` holds back; it stops once they all
/// are, and phase 4's worker, of the same subscription, takes the
/// partition over.
async fn park_ahead(bench: &Bench, relay: Relay, n: usize) -> Result<(), Failure> {
    fill_with(bench, n, |j| {
        Event::new(
            "order",
            format!("h{j}"),
            "order.reminded",
            serde_json::json!({"n": j}),
        )
        .delay(Duration::from_secs(3600))
    })
    .await?;
    let (shutdown, running) = start(bench, vec![relay]).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let parked: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_event_parked")
            .fetch_one(&bench.pool)
            .await
            .map_err(db)?;
        if parked as usize >= n {
            break;
        }
        if Instant::now() > deadline {
            return Err(Failure::runtime(format!(
                "the relay held back {parked} of {n} events delayed an hour within 2 minutes"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    running.await.map_err(Failure::runtime)??;
    Ok(())
}

/// What one drain measured.
struct Drained {
    events_per_s: f64,
    cpu: Cpu,
}

/// CPU time per event published, in microseconds: this process's (the
/// relay's: nothing else runs in it during a drain but the webhook
/// receiver for `--relay webhook` and the mock cluster for `--relay
/// kafka`) and the broker's when it was started here. PostgreSQL's share
/// is in neither. Steadier than a drain's rate on a shared machine.
/// And the whole machine's: its busy CPU time per event (PostgreSQL's and
/// any neighbour's included) and the share of its cores that was busy,
/// which says whether a drain was bound by the CPU.
#[derive(Debug, Serialize, Clone, Copy)]
struct Cpu {
    relay_us: Option<f64>,
    broker_us: Option<f64>,
    machine_us: Option<f64>,
    machine_busy: Option<f64>,
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = |v: Option<f64>| v.map_or_else(|| "?".to_owned(), |v| format!("{v:.1}"));
        write!(f, "CPU per event: relay {} µs", us(self.relay_us))?;
        if self.broker_us.is_some() {
            write!(f, ", broker {} µs", us(self.broker_us))?;
        }
        write!(f, ", machine {} µs", us(self.machine_us))?;
        if let Some(busy) = self.machine_busy {
            write!(f, " ({:.0}% of its cores busy)", busy * 100.0)?;
        }
        Ok(())
    }
}

/// The CPU figures of the three drains.
#[derive(Debug, Serialize)]
struct DrainCpu {
    each_event_its_own_aggregate: Cpu,
    ordered_1000_keys: Cpu,
    two_subscriptions: Cpu,
}

/// Runs a relay worker with `relays` until they published `n` events in
/// all; its rate and CPU per event. `broker` is the broker's process id
/// when it runs here.
async fn drain(
    bench: &Bench,
    relays: &[Relay],
    n: usize,
    broker: Option<u32>,
) -> Result<Drained, Failure> {
    drain_from(bench, relays, n, broker, None).await
}

/// `drain`, its rate timed from `from` when that is later than the relay's
/// start.
async fn drain_from(
    bench: &Bench,
    relays: &[Relay],
    n: usize,
    broker: Option<u32>,
    from: Option<Instant>,
) -> Result<Drained, Failure> {
    let count = Arc::new(AtomicUsize::new(0));
    let relays: Vec<Relay> = relays
        .iter()
        .cloned()
        .map(|r| {
            let count = Arc::clone(&count);
            r.wrap_sink(move |inner| Arc::new(Counted { inner, count }))
        })
        .collect();
    let (shutdown, running) = start(bench, relays).await?;
    let started = Instant::now();
    let cpu_before = (
        cpu_seconds(None),
        broker.and_then(|pid| cpu_seconds(Some(pid))),
        machine_cpu_seconds(),
    );
    let mut last = (0, Instant::now());
    loop {
        let done = count.load(Ordering::Relaxed);
        if done >= n {
            break;
        }
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(120) {
            return Err(Failure::runtime(format!(
                "the relay published {done} of {n} events, then nothing for 2 minutes"
            )));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = from.map_or(started, |from| from.max(started));
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let per_event =
        |before: Option<f64>, after: Option<f64>| Some((after? - before?) * 1e6 / n as f64);
    let machine = cpu_before.2.zip(machine_cpu_seconds());
    let cpu = Cpu {
        relay_us: per_event(cpu_before.0, cpu_seconds(None)),
        broker_us: per_event(cpu_before.1, broker.and_then(|pid| cpu_seconds(Some(pid)))),
        machine_us: machine.and_then(|(before, after)| per_event(Some(before.0), Some(after.0))),
        // Busy and all are sums of the same counters in seconds: a fully
        // busy machine may come out a rounding error over 1.
        machine_busy: machine.map(|(before, after)| {
            ((after.0 - before.0) / (after.1 - before.1).max(1e-9)).clamp(0.0, 1.0)
        }),
    };
    shutdown.cancel();
    running.await.map_err(Failure::runtime)??;
    Ok(Drained {
        events_per_s: rate,
        cpu,
    })
}

/// The least time, over `reference_seconds`, in which `cores` cores
/// could have done `publishes` of `us_per_publish` CPU each (busy CPU
/// time per publish, [`Cpu::machine_us`] or a part of it): every core busy
/// throughout. A drain that kept the cores busy cannot be made faster
/// than this without taking CPU off each publish, and the broker's share
/// of it (on this machine, beside the relay) is not the relay's to take.
fn cpu_floor(
    us_per_publish: Option<f64>,
    publishes: usize,
    reference_seconds: f64,
    cores: usize,
) -> Option<f64> {
    let seconds = us_per_publish? * publishes as f64 / 1e6 / cores.max(1) as f64;
    Some(seconds / reference_seconds.max(1e-9))
}

/// Counts the publishes of one drain.
struct Counted {
    inner: Arc<dyn Sink>,
    count: Arc<AtomicUsize>,
}

impl Sink for Counted {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn default_concurrency(&self) -> usize {
        self.inner.default_concurrency()
    }

    fn check(&self, message: &Message) -> Result<(), PublishError> {
        self.inner.check(message)
    }

    fn check_route(&self, route: &outbox::relay::Route) -> Result<(), String> {
        self.inner.check_route(route)
    }

    fn unreachable(&self) -> Option<String> {
        self.inner.unreachable()
    }

    fn preflight<'a>(
        &'a self,
        route: &'a outbox::relay::Route,
    ) -> outbox::relay::PreflightFuture<'a> {
        self.inner.preflight(route)
    }

    fn publish<'a>(&'a self, message: &'a Message) -> PublishFuture<'a> {
        Box::pin(async move {
            self.inner.publish(message).await?;
            self.count.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }
}

type Started = (
    CancellationToken,
    tokio::task::JoinHandle<outbox::Result<()>>,
);

async fn start(bench: &Bench, relays: Vec<Relay>) -> Result<Started, Failure> {
    let pool = connect_bench(&bench.url, 8).await?;
    let mut builder = Worker::builder(pool).config(WorkerConfig {
        maintenance: false,
        ..WorkerConfig::default()
    });
    for relay in relays {
        builder = builder.relay(relay);
    }
    let worker = builder.build()?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    Ok((shutdown, running))
}

/// Emits at the configured rate with the relay running; commit-to-ack.
async fn latency(
    bench: &Bench,
    relay: Relay,
    acked: &Arc<Mutex<HashMap<String, Instant>>>,
) -> Result<Latency, Failure> {
    let args = &bench.args.relay;
    let (shutdown, running) = start(bench, vec![relay]).await?;
    // Let it start (the subscription, the broker connection).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let total = args.relay_rate * args.relay_seconds;
    let every = Duration::from_secs(1).div_f64(args.relay_rate as f64);
    let mut committed = Vec::with_capacity(total);
    let mut next = tokio::time::Instant::now();
    for i in 0..total {
        tokio::time::sleep_until(next).await;
        next += every;
        let id = format!("{LATENCY_IDS}{i:012x}");
        let mut tx = bench.pool.begin().await.map_err(db)?;
        emit(
            &mut tx,
            Event::new(
                "order",
                (i % 1000).to_string(),
                "order.updated",
                serde_json::json!({}),
            )
            .id(id.clone()),
        )
        .await?;
        tx.commit().await.map_err(db)?;
        committed.push((id, Instant::now()));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = acked.lock().unwrap_or_else(|p| p.into_inner()).len();
        if got >= total {
            break;
        }
        if Instant::now() > deadline {
            let (first_missing, missing): (Vec<usize>, Vec<String>) = {
                let acked = acked.lock().unwrap_or_else(|p| p.into_inner());
                committed
                    .iter()
                    .enumerate()
                    .filter(|(_, (id, _))| !acked.contains_key(id))
                    .map(|(i, (id, _))| (i, id.clone()))
                    .unzip()
            };
            let first_missing = first_missing.first().copied().unwrap_or(total);
            // Where the relay stands against the events it has not
            // published, to tell an event passed over from one held up.
            let state: Option<String> = sqlx::query_scalar(include_str!("sql/latency_missing.sql"))
                .bind(&missing)
                .fetch_one(&bench.pool)
                .await
                .ok()
                .flatten();
            return Err(Failure::runtime(format!(
                "the latency phase's events were not all published within a minute: {got} of \
                 {total} acknowledged, the first one missing emitted {first_missing} events into \
                 the phase; {}",
                state.unwrap_or_default()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    running.await.map_err(Failure::runtime)??;
    let acked = acked.lock().unwrap_or_else(|p| p.into_inner());
    let ms = committed
        .iter()
        .map(|(id, at)| {
            acked.get(id).map_or(0.0, |ack| {
                ack.saturating_duration_since(*at).as_secs_f64() * 1e3
            })
        })
        .collect();
    Ok(Latency::of(ms))
}
