//! Two subscriptions on one broker, routed to different destinations (an
//! audit stream beside the main one, say): each destination gets every
//! event. A broker's dedup by event id alone would take the second
//! subscription's copy for a repeat of the first's and drop it.

use std::time::Duration;

use futures_util::TryStreamExt as _;

use outbox::relay::Relay;
use outbox_tests::TestDb;
use outbox_tests::brokers::{self, Kind};
use tokio_util::sync::CancellationToken;

/// Events emitted, over a few aggregates.
const EVENTS: usize = 40;

/// Emits the events, runs relays `a` and `b` (each routed to
/// `<name>.{aggregate_type}`) until both have published all of them.
async fn relay_twice(db: &TestDb, url: &str) {
    let mut conn = db.conn().await;
    for i in 0..EVENTS {
        let event = outbox::Event::new("order", format!("o-{}", i % 4), "order.placed", i);
        outbox::emit(&mut conn, event).await.expect("emit");
    }
    drop(conn);
    let mut builder = outbox::Worker::builder(db.pool.clone());
    for name in ["a", "b"] {
        let relay = Relay::from_url(name, url)
            .await
            .expect("a relay from the URL")
            .route(&format!("{name}.{{aggregate_type}}"))
            .poll_interval(Duration::from_millis(10));
        builder = builder.relay(relay);
    }
    let worker = builder.build().expect("a relay worker");
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let subs = outbox::relay::subscriptions(&db.pool)
            .await
            .unwrap_or_default();
        let published: Vec<i64> = ["a", "b"]
            .iter()
            .map(|n| {
                subs.iter()
                    .find(|s| s.name == *n)
                    .map_or(0, |s| s.published)
            })
            .collect();
        if published.iter().all(|&p| p >= EVENTS as i64) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "published {published:?} of {EVENTS} each within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.expect("worker task").expect("worker run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_subscriptions_to_one_nats_stream_each_store_every_event() {
    let Some(server) = brokers::start(Kind::Nats).await else {
        return;
    };
    let db = TestDb::migrated().await;
    let url = format!(
        "{}?stream=EVENTS&stream_subjects=a.>,b.>",
        Kind::Nats.url(&server)
    );
    relay_twice(&db, &url).await;
    let client = async_nats::connect(Kind::Nats.url(&server))
        .await
        .expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream("EVENTS").await.expect("the stream");
    for subject in ["a.order", "b.order"] {
        let counts: std::collections::HashMap<String, usize> = stream
            .info_with_subjects(subject)
            .await
            .expect("the stream's subjects")
            .try_collect()
            .await
            .expect("subject counts");
        assert_eq!(
            counts.get(subject).copied(),
            Some(EVENTS),
            "{subject}: {counts:?}"
        );
    }
    assert_eq!(
        stream.info().await.expect("stream info").state.messages,
        2 * EVENTS as u64,
        "one copy of each event for each subscription"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_subscriptions_to_one_redis_each_add_every_event() {
    let Some(server) = brokers::start(Kind::Redis).await else {
        return;
    };
    let db = TestDb::migrated().await;
    relay_twice(&db, &Kind::Redis.url(&server)).await;
    let patient = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(60)))
        .set_response_timeout(Some(Duration::from_secs(60)));
    let mut conn = redis::Client::open(Kind::Redis.url(&server))
        .expect("Redis URL")
        .get_multiplexed_async_connection_with_config(&patient)
        .await
        .expect("connect to Redis");
    for stream in ["a.order", "b.order"] {
        let len: usize = redis::cmd("XLEN")
            .arg(stream)
            .query_async(&mut conn)
            .await
            .expect("XLEN");
        assert_eq!(len, EVENTS, "{stream}");
    }
}
