//! The receiving side: an inbox that recognises an event delivered again.
//!
//! Relays deliver at least once, so a consumer sees some events twice
//! (after a relay's crash, a broker's redelivery). Record each event in the
//! consumer's own transaction, next to its effects; a redelivered event
//! then finds its record and is skipped, exactly when its effects
//! committed.
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool, event_id: &str) -> outbox::Result<()> {
//! let mut tx = pool.begin().await?;
//! if outbox::events::inbox::first_time(&mut tx, "billing", event_id).await? {
//!     // ... apply the event's effects on &mut *tx ...
//! }
//! tx.commit().await?; // then acknowledge the message to the broker
//! # Ok(()) }
//! ```

use sqlx::PgConnection;

use crate::error::{Error, Result};

/// The longest consumer name or event id, in bytes.
pub const MAX_INBOX_KEY: usize = 255;

/// Records that `consumer` processed `event_id`, in the transaction open on
/// `conn`. True the first time; false when it was recorded before (by a
/// committed transaction, or one still open: then this call waits for it,
/// as a unique index does).
pub async fn first_time(conn: &mut PgConnection, consumer: &str, event_id: &str) -> Result<bool> {
    for (what, value) in [("consumer", consumer), ("event id", event_id)] {
        if value.is_empty() || value.len() > MAX_INBOX_KEY || value.contains('\0') {
            return Err(Error::InvalidOption(format!(
                "inbox {what} of {} bytes: use 1 to {MAX_INBOX_KEY} bytes without U+0000",
                value.len()
            )));
        }
    }
    let inserted: Option<i32> = sqlx::query_scalar(
        "INSERT INTO outbox_inbox (consumer, event_id) VALUES ($1, $2) \
         ON CONFLICT DO NOTHING RETURNING 1",
    )
    .bind(consumer)
    .bind(event_id)
    .fetch_optional(conn)
    .await?;
    Ok(inserted.is_some())
}

/// Deletes up to `limit` inbox records older than `older_than`; returns how
/// many. A worker's maintenance leader does this with the completed-task
/// retention; a consumer's database without a worker calls it itself. Keep
/// records longer than any redelivery can come late.
pub async fn prune(
    conn: &mut PgConnection,
    older_than: std::time::Duration,
    limit: i64,
) -> Result<u64> {
    let retention_us = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
    Ok(crate::db::events::prune_inbox(conn, retention_us, limit, None).await?)
}
