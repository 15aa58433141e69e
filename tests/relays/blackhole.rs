//! The broker's connection black-holed (a fault proxy between the relay
//! and nats-server forwards nothing, sockets open, no error either side)
//! while events are emitted: publishes time out as transient failures
//! (which `events subscriptions` shows, with the reason),
//! the circuit opens, the cursor stays, and once the network is back every
//! event is published, each aggregate in order.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use outbox::Worker;
use outbox::events::{Event, emit};
use outbox::relay::{Message, PublishError, PublishFuture, Relay, Sink};
use outbox_tests::TestDb;
use outbox_tests::brokers::{self, Kind};
use outbox_tests::proxy::FaultProxy;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Counts acknowledged publishes (the real sink inside does the work).
struct Counting {
    inner: Arc<dyn Sink>,
    acked: Arc<Mutex<usize>>,
}

impl Sink for Counting {
    fn kind(&self) -> &'static str {
        self.inner.kind()
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
            *self.acked.lock().unwrap() += 1;
            Ok(())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_broker_connection_loses_nothing_and_keeps_order() {
    let _turn = crate::heavy_turn().await;
    let Some(server) = brokers::start(Kind::Nats).await else {
        return;
    };
    let proxy = FaultProxy::start_tcp(([127, 0, 0, 1], server.port).into()).await;
    let db = TestDb::migrated().await;
    let acked = Arc::new(Mutex::new(0));
    let relay = Relay::from_url(
        "nats",
        &format!(
            "nats://127.0.0.1:{}?stream=HOLE&timeout_ms=1000",
            proxy.port()
        ),
    )
    .await
    .expect("a NATS relay")
    .poll_interval(Duration::from_millis(5))
    .wrap_sink({
        let acked = Arc::clone(&acked);
        move |inner| Arc::new(Counting { inner, acked })
    });
    let worker = Worker::builder(db.pool.clone())
        .relay(relay)
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let emit_some = async |from: usize, to: usize| {
        for i in from..to {
            emit(
                &mut *db.conn().await,
                Event::new("order", (i % 20).to_string(), "e", json!({"i": i})),
            )
            .await
            .unwrap();
        }
    };
    let wait_acked = async |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while *acked.lock().unwrap() < n {
            assert!(
                Instant::now() < deadline,
                "{} of {n} acknowledged",
                acked.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    emit_some(0, 200).await;
    wait_acked(200).await;
    proxy.blackhole();
    emit_some(200, 400).await;
    // Publishes time out and the batch waits; the subscription's listing
    // says so, with the reason. Several publish timeouts' worth of it
    // (1 s each), which opens the circuit.
    let failing = async |want: bool| {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let subs = outbox::relay::subscriptions(&db.pool).await.unwrap();
            let sub = subs.first();
            let why = sub.and_then(|s| s.failing.clone());
            let long = sub.and_then(|s| s.failing_s).is_some_and(|s| s >= 4.0);
            if (want && long) || (!want && why.is_none()) {
                return why;
            }
            assert!(Instant::now() < deadline, "failing is still {why:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let why = failing(true).await.expect("a reason");
    assert!(why.starts_with("timeout: "), "{why}");
    let during = *acked.lock().unwrap();
    proxy.pass();
    wait_acked(400).await;
    failing(false).await;
    stop.cancel();
    running.await.unwrap().unwrap();
    eprintln!(
        "blackhole: {} acknowledged while the network was silent",
        during - 200
    );

    // Read the stream back: every event once (JetStream drops repeats by
    // Nats-Msg-Id), each aggregate in order.
    let client = async_nats::connect(Kind::Nats.url(&server)).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("HOLE").await.unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut total = 0;
    while total < 400 {
        // Generous, as the other brokers' read-backs: a loaded machine's
        // pull can stall for seconds, while a message that is not there
        // never comes.
        let m = tokio::time::timeout(Duration::from_secs(60), messages.next())
            .await
            .unwrap_or_else(|_| panic!("got {total} of 400 messages from the stream"))
            .unwrap()
            .unwrap();
        let h = m.headers.as_ref().unwrap();
        let get = |n: &str| h.get(n).map(|v| v.as_str().to_owned()).unwrap_or_default();
        per_key
            .entry(get("aggregate-id"))
            .or_default()
            .push(get("sequence").parse().unwrap());
        total += 1;
    }
    assert_eq!(per_key.len(), 20);
    for (key, seqs) in &per_key {
        assert_eq!(seqs.len(), 20, "aggregate {key}");
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "aggregate {key}: {seqs:?}"
        );
    }
    drop(proxy);
}
