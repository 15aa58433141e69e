//! Run with: DATABASE_URL=postgres://... KAFKA_BROKERS=127.0.0.1:9092 \
//!     cargo run -p events-example --bin kafka-consumer
//!
//! A consumer group member on `outbox.event.customer`: each record is
//! applied in a transaction that also records its event id in the inbox,
//! and its offset is committed only after that commit. A crash between the
//! two redelivers the record (to this member or another of the group); the
//! inbox recognises it. Relay the events with a worker built with the Kafka
//! client (librdkafka, built from source: it needs a C toolchain and make):
//!     cargo run -p outbox-worker --features kafka -- \
//!         run --relay 'kafka=kafka://127.0.0.1:9092'

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::{Headers as _, Message as _};
use sqlx::PgPool;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let pool = PgPool::connect(&url).await?;
    events_example::setup(&pool).await?;
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", events_example::CONSUMER)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        // A member that died gives its partitions up after 6 s, not 45.
        .set("session.timeout.ms", "6000")
        .create()?;
    consumer.subscribe(&["outbox.event.customer"])?;
    println!("consuming outbox.event.customer");
    loop {
        let record = match consumer.recv().await {
            Ok(record) => record,
            Err(e) => {
                eprintln!("kafka: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let event_id = record.headers().and_then(|h| {
            h.iter()
                .find(|h| h.key == "event-id")
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        });
        let Some(event_id) = event_id else {
            // Not ours to apply, and no retry will give it an id: skip it.
            eprintln!(
                "offset {}: a record without an event-id header; skipped",
                record.offset()
            );
            consumer.commit_message(&record, CommitMode::Async)?;
            continue;
        };
        // A partition's offsets are committed in order, so moving past a
        // record that was not applied would lose it: a transient failure
        // (the database restarting) is retried until it goes through; only
        // a record that can never apply (an undecodable payload) is skipped.
        let payload = record.payload().unwrap_or_default();
        loop {
            match events_example::apply(&pool, &event_id, payload).await {
                Ok(_) => break,
                Err(outbox::Error::Database(e)) if outbox::is_transient(&e) => {
                    eprintln!("event {event_id}: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    eprintln!("event {event_id}: {e}; skipped");
                    break;
                }
            }
        }
        consumer.commit_message(&record, CommitMode::Async)?;
    }
}
