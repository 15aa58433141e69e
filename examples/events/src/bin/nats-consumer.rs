//! Run with: DATABASE_URL=postgres://... NATS_URL=nats://127.0.0.1:4222 \
//!     cargo run -p events-example --bin nats-consumer
//!
//! A durable JetStream consumer of `outbox.event.customer`: each message is
//! applied in a transaction that also records its event id in the inbox,
//! and acknowledged only after that commit. A crash between the commit and
//! the ack redelivers the message; the inbox recognises it.

use futures_util::StreamExt as _;
use sqlx::PgPool;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let pool = PgPool::connect(&url).await?;
    events_example::setup(&pool).await?;
    let js = async_nats::jetstream::new(async_nats::connect(&nats).await?);
    // The relay makes the stream on its first publish; wait for it.
    let stream = loop {
        match js.get_stream("EVENTS").await {
            Ok(stream) => break stream,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    };
    let consumer = stream
        .get_or_create_consumer(
            events_example::CONSUMER,
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some(events_example::CONSUMER.to_owned()),
                filter_subject: "outbox.event.customer".to_owned(),
                ack_wait: std::time::Duration::from_secs(5),
                ..Default::default()
            },
        )
        .await?;
    println!("consuming outbox.event.customer");
    let mut messages = consumer.messages().await?;
    while let Some(message) = messages.next().await {
        // A pull stream reports trouble (a missed heartbeat on a busy
        // machine, a reconnect) as an item and then goes on: not a reason
        // to stop consuming.
        let message = match message {
            Ok(message) => message,
            Err(error) => {
                eprintln!("consumer: {error}; going on");
                continue;
            }
        };
        let event_id = message
            .headers
            .as_ref()
            .and_then(|h| h.get("event-id"))
            .map(|v| v.as_str().to_owned());
        let Some(event_id) = event_id else {
            // Not ours to apply, and no redelivery will give it an id.
            eprintln!("consumer: a message without an event-id header; dropped");
            if let Err(error) = message.ack().await {
                eprintln!("consumer: ack failed: {error}");
            }
            continue;
        };
        match events_example::apply(&pool, &event_id, &message.payload).await {
            Ok(_) => {}
            // Never applicable: JetStream is told not to redeliver it.
            Err(error @ outbox::Error::InvalidEvent(_)) => {
                eprintln!("consumer: {error}; dropped");
                if let Err(error) = message.ack_with(async_nats::jetstream::AckKind::Term).await {
                    eprintln!("consumer: ack failed: {error}");
                }
                continue;
            }
            // Not applied (the database went away): no ack, so the message
            // comes back after the ack wait and the inbox decides then.
            Err(error) => {
                eprintln!(
                    "consumer: event {event_id} not applied: {error}; it will be redelivered"
                );
                continue;
            }
        }
        if let Err(error) = message.ack().await {
            eprintln!("consumer: ack of {event_id} failed: {error}; it will be redelivered");
        }
    }
    Ok(())
}
