//! docs/guide.md, section 11: events and relays.

use std::error::Error;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

async fn emit_an_event(pool: &PgPool) -> Result<(), Box<dyn Error + Send + Sync>> {
use outbox::events::{emit, Event};

let mut tx = pool.begin().await?;
sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
    .bind(42_i64).bind(990_i64).execute(&mut *tx).await?;
emit(&mut tx, Event::new("order", "42", "order.placed", serde_json::json!({"total_cents": 990}))
    .header("tenant", "acme")).await?;
tx.commit().await?;
Ok(())
}

async fn emit_several(pool: &PgPool) -> Result<(), Box<dyn Error + Send + Sync>> {
use outbox::events::{emit_all, Event};

let mut tx = pool.begin().await?;
emit_all(&mut tx, [
    Event::new("order", "42", "order.paid", serde_json::json!({})),
    Event::new("customer", "7", "customer.charged", serde_json::json!({"cents": 990})),
]).await?;
tx.commit().await?;
Ok(())
}

/// Stands for the application's own settings.
struct Settings {
    webhook_secret: String,
}

async fn relay_from_code(pool: PgPool, shutdown: CancellationToken, settings: Settings) -> Result<(), Box<dyn Error + Send + Sync>> {
use outbox::relay::Relay;

let relay = Relay::from_url("nats", "nats://127.0.0.1:4222?stream=EVENTS").await?
    .concurrency(200);
let hooks = Relay::from_url_with_secret("hooks", "https://example.com/hooks",
                                        &settings.webhook_secret).await?;   // whsec_...
outbox::Worker::builder(pool).relay(relay).relay(hooks).build()?.run(shutdown).await?;
Ok(())
}

async fn consume(pool: &PgPool, event_id: &str) -> Result<(), Box<dyn Error + Send + Sync>> {
let mut tx = pool.begin().await?;
if outbox::events::inbox::first_time(&mut tx, "billing", event_id).await? {
    // apply the event's effects on &mut *tx
}
tx.commit().await?;   // then acknowledge the message to the broker
Ok(())
}
