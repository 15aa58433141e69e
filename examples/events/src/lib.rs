//! The events example: an order and its `order.placed` event commit
//! together; a relay publishes the event to NATS JetStream; a consumer in
//! another service applies it to a read model exactly once, recording the
//! event id in its inbox in the same transaction as the effect.

use outbox::events::{Event, emit, inbox};
use sqlx::PgPool;

/// The consumer's name in the inbox.
pub const CONSUMER: &str = "customer-totals";

/// Creates the example's tables (orders on the emitting side, totals on
/// the consuming side; one database here for brevity). The service and the
/// consumers may start together: `CREATE TABLE IF NOT EXISTS` run twice at
/// once can fail on the second, so they take turns under a lock.
pub async fn setup(pool: &PgPool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    outbox::migrate(pool).await?;
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('events-example setup'))")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS orders (
             id bigserial PRIMARY KEY, customer text NOT NULL, amount_cents bigint NOT NULL);
         CREATE TABLE IF NOT EXISTS customer_totals (
             customer text PRIMARY KEY, orders bigint NOT NULL, cents bigint NOT NULL);",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Saves an order and emits its event in one transaction; returns its id.
pub async fn place_order(pool: &PgPool, customer: &str, amount_cents: i64) -> outbox::Result<i64> {
    let mut tx = pool.begin().await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO orders (customer, amount_cents) VALUES ($1, $2) RETURNING id",
    )
    .bind(customer)
    .bind(amount_cents)
    .fetch_one(&mut *tx)
    .await?;
    // The aggregate is the customer: one customer's events are published
    // in the order their transactions committed.
    let event = Event::new(
        "customer",
        customer,
        "order.placed",
        serde_json::json!({ "order_id": id, "customer": customer, "amount_cents": amount_cents }),
    );
    emit(&mut tx, event).await?;
    tx.commit().await?;
    Ok(id)
}

/// Applies one `order.placed` event to the totals, once: a redelivered
/// event finds its inbox record and changes nothing. True when applied now.
/// A payload that is not an `order.placed` event (another source on the
/// subject, a bug) is refused with [`outbox::Error::InvalidEvent`], which
/// no redelivery changes; a database failure is [`outbox::Error::Database`].
pub async fn apply(pool: &PgPool, event_id: &str, payload: &[u8]) -> outbox::Result<bool> {
    let malformed = |why: String| {
        outbox::Error::InvalidEvent(format!(
            "event {event_id} is not an order.placed event: {why}"
        ))
    };
    let event: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| malformed(e.to_string()))?;
    // Each field checked, not defaulted: an empty customer would be a row
    // of the read model.
    let customer = event["customer"]
        .as_str()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| malformed("no customer".to_owned()))?;
    let cents = event["amount_cents"]
        .as_i64()
        .ok_or_else(|| malformed("no whole amount_cents".to_owned()))?;
    let mut tx = pool.begin().await?;
    if !inbox::first_time(&mut tx, CONSUMER, event_id).await? {
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO customer_totals (customer, orders, cents) VALUES ($1, 1, $2)
         ON CONFLICT (customer) DO UPDATE
         SET orders = customer_totals.orders + 1, cents = customer_totals.cents + $2",
    )
    .bind(customer)
    .bind(cents)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}
