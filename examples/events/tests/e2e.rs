//! The events example for real: the service's emit, the relay to a real
//! nats-server (the stock worker, a separate process) or to librdkafka's
//! mock Kafka cluster, and the consumer (a separate process) killed with
//! SIGKILL mid-stream and restarted. Every order must be counted exactly
//! once in the totals.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use outbox_tests::TestDb;
use outbox_tests::brokers::{self, Kind};
use outbox_tests::process::WorkerProcess;

const CONSUMER: &str = env!("CARGO_BIN_EXE_nats-consumer");
const RELAY: &str = env!("CARGO_BIN_EXE_events-worker");
const KAFKA_CONSUMER: &str = env!("CARGO_BIN_EXE_kafka-consumer");

struct Consumer(Child);

impl Consumer {
    fn start(db: &TestDb, nats: &str) -> Self {
        Self(
            Command::new(CONSUMER)
                .env("DATABASE_URL", &db.url)
                .env("NATS_URL", nats)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("start the consumer"),
        )
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn totals(db: &TestDb) -> (i64, i64) {
    sqlx::query_as("SELECT coalesce(sum(orders), 0)::bigint, coalesce(sum(cents), 0)::bigint FROM customer_totals")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_order_is_counted_once_through_the_relay_and_a_killed_consumer() {
    let Some(server) = brokers::start(Kind::Nats).await else {
        return;
    };
    let nats = Kind::Nats.url(&server);
    let db = TestDb::migrated().await;
    events_example::setup(&db.pool).await.unwrap();
    let relay = format!("nats={nats}?stream=EVENTS");
    let _relay = WorkerProcess::spawn(RELAY, &db.url, &["--relay", &relay]);

    let mut consumer = Consumer::start(&db, &nats);
    let (mut orders, mut cents) = (0, 0);
    for i in 0..400_i64 {
        let customer = format!("c{}", i % 17);
        events_example::place_order(&db.pool, &customer, 100 + i)
            .await
            .unwrap();
        orders += 1;
        cents += 100 + i;
        if i == 200 {
            // Mid-stream: kill the consumer (some applied events are not
            // acknowledged yet) and start it again.
            let _ = consumer.0.kill();
            let _ = consumer.0.wait();
            consumer = Consumer::start(&db, &nats);
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while totals(&db).await.0 < orders {
        assert!(
            tokio::time::Instant::now() < deadline,
            "totals stuck at {:?}; the consumer: {:?} (None: still running)",
            totals(&db).await,
            consumer.0.try_wait()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let redeliveries (ack wait 5 s) arrive; none may count twice.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(totals(&db).await, (orders, cents));
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_inbox")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(recorded, orders, "one inbox record per event");
    drop(consumer);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_kafka_consumer_counts_every_order_once_through_the_relay() {
    // librdkafka's mock cluster (the real protocol), in this process.
    let cluster = rdkafka::mocking::MockCluster::new(3).expect("a mock Kafka cluster");
    cluster
        .create_topic("outbox.event.customer", 3, 3)
        .expect("the topic");
    let brokers = cluster.bootstrap_servers();
    let db = TestDb::migrated().await;
    events_example::setup(&db.pool).await.unwrap();
    let relay = outbox::relay::Relay::from_url("kafka", &format!("kafka://{brokers}"))
        .await
        .expect("a Kafka relay");
    let worker = outbox_tests::RunningWorker::start(
        outbox::Worker::builder(db.pool.clone())
            .relay(relay)
            .build()
            .expect("a relay worker"),
    );
    let mut consumer = Consumer(
        Command::new(KAFKA_CONSUMER)
            .env("DATABASE_URL", &db.url)
            .env("KAFKA_BROKERS", &brokers)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the Kafka consumer"),
    );
    let (mut orders, mut cents) = (0, 0);
    for i in 0..300_i64 {
        let customer = format!("c{}", i % 11);
        events_example::place_order(&db.pool, &customer, 100 + i)
            .await
            .unwrap();
        orders += 1;
        cents += 100 + i;
        if i == 150 {
            // Mid-stream: kill the consumer (applied records whose offsets
            // are not committed yet come again) and start it again.
            let _ = consumer.0.kill();
            let _ = consumer.0.wait();
            consumer = Consumer(
                Command::new(KAFKA_CONSUMER)
                    .env("DATABASE_URL", &db.url)
                    .env("KAFKA_BROKERS", &brokers)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("restart the Kafka consumer"),
            );
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while totals(&db).await.0 < orders {
        assert!(
            tokio::time::Instant::now() < deadline,
            "totals stuck at {:?}; the consumer: {:?} (None: still running)",
            totals(&db).await,
            consumer.0.try_wait()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(totals(&db).await, (orders, cents));
    drop(consumer);
    worker.stop().await;
}

/// What the consumers apply: an event once (a redelivery changes nothing),
/// a payload that is not an `order.placed` event never (no row of an empty
/// customer), and the set-up run by the service and a consumer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apply_counts_an_event_once_and_refuses_one_that_is_not_an_order() {
    let db = TestDb::empty().await;
    let (a, b) = tokio::join!(
        events_example::setup(&db.pool),
        events_example::setup(&db.pool)
    );
    a.unwrap();
    b.unwrap();
    let id = "0190a0b0-0000-7000-8000-000000000001";
    let good = br#"{"order_id": 1, "customer": "ada", "amount_cents": 990}"#;
    assert!(events_example::apply(&db.pool, id, good).await.unwrap());
    assert!(!events_example::apply(&db.pool, id, good).await.unwrap());
    for bad in [
        &br#"{"order_id": 2}"#[..],
        br#"{"customer": "", "amount_cents": 1}"#,
        b"not json",
    ] {
        let refused =
            events_example::apply(&db.pool, "0190a0b0-0000-7000-8000-000000000002", bad).await;
        assert!(
            matches!(refused, Err(outbox::Error::InvalidEvent(_))),
            "{refused:?}"
        );
    }
    assert_eq!(totals(&db).await, (1, 990));
}
