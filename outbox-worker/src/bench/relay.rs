//! `bench --relay KIND`: what a relay publishes per second and how long an
//! event takes from its commit to the broker's acknowledgement.
//!
//! The broker is started here on a free loopback port (nats-server with
//! JetStream, redis-server with `appendfsync always`) or, for webhooks, an
//! in-process HTTP receiver that answers 204; `--relay-url` points at a
//! running broker instead. Phases:
//! 1. `--relay-events` events over as many aggregates, then one relay
//!    worker drains them: events/s;
//! 2. the same over 1,000 aggregates, each in strict order: events/s;
//! 3. events emitted one per transaction at `--relay-rate` per second for
//!    `--relay-seconds` while the relay runs: commit-to-ack p50/p99.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use outbox::events::{Event, emit, emit_all};
use outbox::relay::{Message, PublishFuture, Relay, Sink};
use outbox::{TaskEventKind, Worker, WorkerConfig};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{Bench, Latency, db};
use crate::connect::connect;
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
    /// --relay`); its kind must match --relay.
    #[arg(long)]
    relay_url: Option<String>,
    /// Events in each throughput phase.
    #[arg(long, default_value_t = 50_000, value_parser = flags::count(1, 10_000_000))]
    relay_events: usize,
    /// The relay's concurrency (events in flight).
    #[arg(long, default_value_t = 100, value_parser = flags::count(1, outbox::MAX_CONCURRENCY as u64))]
    relay_concurrency: usize,
    /// Events per second in the latency phase.
    #[arg(long, default_value_t = 1000, value_parser = flags::count(1, 100_000))]
    relay_rate: usize,
    /// How long the latency phase emits.
    #[arg(long, default_value_t = 10, value_parser = flags::count(1, 3600))]
    relay_seconds: usize,
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
    /// Emitted one per transaction at this rate.
    latency_rate_per_s: usize,
    /// From the emitting transaction's commit returning to the broker's ack.
    commit_to_ack_ms: Latency,
}

/// A sink that notes when each event was acknowledged.
struct Timed {
    inner: Arc<dyn Sink>,
    acked: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Sink for Timed {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn publish<'a>(&'a self, message: &'a Message) -> PublishFuture<'a> {
        Box::pin(async move {
            self.inner.publish(message).await?;
            self.acked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(message.event_id.clone())
                .or_insert_with(Instant::now);
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

pub(crate) async fn measure(bench: &Bench, kind: RelayKind) -> Result<RelayReport, Failure> {
    let args = &bench.args.relay;
    let (url, broker) = match &args.relay_url {
        Some(url) => (url.clone(), Running::External),
        None => start_broker(kind).await?,
    };
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let make = async |acked: &Arc<Mutex<HashMap<String, Instant>>>| -> Result<Relay, Failure> {
        let acked = Arc::clone(acked);
        let relay = match &broker {
            // guest's password would have to come from the environment.
            Running::Process(server) if kind == RelayKind::Rabbitmq => Relay::new(
                "bench",
                outbox::relay::rabbitmq::RabbitSink::new(
                    &format!("amqp://guest:guest@127.0.0.1:{}/%2f", server.port),
                    "outbox",
                )
                .declare_exchange("topic")
                .map_err(Failure::config)?
                .bind_queue("bench"),
            ),
            _ => Relay::from_url("bench", &url)
                .await
                .map_err(Failure::config)?,
        };
        Ok(relay
            .concurrency(args.relay_concurrency)
            .wrap_sink(move |inner| Arc::new(Timed { inner, acked })))
    };
    let n = args.relay_events;
    bench.say(format!(
        "relay {kind:?}: {n} events per throughput phase, concurrency {}",
        args.relay_concurrency
    ));

    reset(bench).await?;
    fill(bench, n, |i| i.to_string()).await?;
    let events_per_s = drain(bench, make(&acked).await?, n).await?;
    bench.say(format!(
        "  each event its own aggregate: {events_per_s:.0} events/s"
    ));

    reset(bench).await?;
    fill(bench, n, |i| (i % 1000).to_string()).await?;
    let ordered = drain(bench, make(&acked).await?, n).await?;
    bench.say(format!(
        "  1,000 aggregates in strict order: {ordered:.0} events/s"
    ));

    acked.lock().unwrap_or_else(|p| p.into_inner()).clear();
    reset(bench).await?;
    let latency = latency(bench, make(&acked).await?, &acked).await?;
    bench.say(format!(
        "  commit to ack at {} events/s: {latency}",
        args.relay_rate
    ));
    drop(broker);
    Ok(RelayReport {
        relay: kind,
        concurrency: args.relay_concurrency,
        events: n,
        events_per_s,
        ordered_1000_keys_events_per_s: ordered,
        latency_rate_per_s: args.relay_rate,
        commit_to_ack_ms: latency,
    })
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
        Kind::Nats => format!("{}?stream=BENCH", local.url(&server)),
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

/// Removes the events of the phases before, their keys' lock rows and
/// their dead row versions, and flushes them to disk: each phase starts on
/// an empty queue, not behind the last one's cleanup.
async fn reset(bench: &Bench) -> Result<(), Failure> {
    for sql in [
        "DELETE FROM outbox_tasks WHERE queue = 'events'",
        "DELETE FROM outbox_task_history WHERE queue = 'events'",
        "DELETE FROM outbox_keys WHERE queue = 'events'",
        "VACUUM ANALYZE outbox_tasks",
        "VACUUM ANALYZE outbox_task_history",
        "VACUUM ANALYZE outbox_keys",
    ] {
        sqlx::query(sql).execute(&bench.pool).await.map_err(db)?;
    }
    bench.checkpoint().await;
    Ok(())
}

/// Emits `n` events, event `i` on aggregate `key(i)`, in transactions of
/// 1,000.
async fn fill(bench: &Bench, n: usize, key: impl Fn(usize) -> String) -> Result<(), Failure> {
    let mut i = 0;
    while i < n {
        let end = (i + 1000).min(n);
        let mut tx = bench.pool.begin().await.map_err(db)?;
        emit_all(
            &mut tx,
            (i..end).map(|j| {
                Event::new(
                    "order",
                    key(j),
                    "order.updated",
                    serde_json::json!({"n": j}),
                )
            }),
        )
        .await?;
        tx.commit().await.map_err(db)?;
        i = end;
    }
    Ok(())
}

/// Runs a relay worker until `n` events are published; events/s.
async fn drain(bench: &Bench, relay: Relay, n: usize) -> Result<f64, Failure> {
    let (worker, shutdown, running) = start(bench, relay).await?;
    let mut events = worker;
    let started = Instant::now();
    let mut done = 0;
    while done < n {
        match tokio::time::timeout(Duration::from_secs(120), events.recv()).await {
            Ok(Ok(e)) if e.kind == TaskEventKind::Completed => done += 1,
            Ok(Ok(_)) | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
            _ => {
                return Err(Failure::runtime(format!(
                    "the relay published {done} of {n} events, then nothing for 2 minutes"
                )));
            }
        }
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    shutdown.cancel();
    running.await.map_err(Failure::runtime)??;
    Ok(rate)
}

type Started = (
    tokio::sync::broadcast::Receiver<outbox::TaskEvent>,
    CancellationToken,
    tokio::task::JoinHandle<outbox::Result<()>>,
);

async fn start(bench: &Bench, relay: Relay) -> Result<Started, Failure> {
    let pool = connect(&bench.url, 8).await?;
    let worker = Worker::builder(pool)
        .config(WorkerConfig {
            maintenance: false,
            ..WorkerConfig::default()
        })
        .relay(relay)
        .build()?;
    let events = worker.subscribe();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    Ok((events, shutdown, running))
}

/// Emits at the configured rate with the relay running; commit-to-ack.
async fn latency(
    bench: &Bench,
    relay: Relay,
    acked: &Arc<Mutex<HashMap<String, Instant>>>,
) -> Result<Latency, Failure> {
    let args = &bench.args.relay;
    let (_events, shutdown, running) = start(bench, relay).await?;
    // Let it start (the first claim, the broker connection).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let total = args.relay_rate * args.relay_seconds;
    let every = Duration::from_secs(1).div_f64(args.relay_rate as f64);
    let mut committed = Vec::with_capacity(total);
    let mut next = tokio::time::Instant::now();
    for i in 0..total {
        tokio::time::sleep_until(next).await;
        next += every;
        let id = format!("00000000-0000-4000-8000-{i:012x}");
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
    while acked.lock().unwrap_or_else(|p| p.into_inner()).len() < total {
        if Instant::now() > deadline {
            return Err(Failure::runtime(
                "the latency phase's events were not all published within a minute",
            ));
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
