//! Statements about events' side tables: the inbox and the Debezium mirror.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::delete_expired;

/// Deletes up to `limit` inbox records and `limit` mirror rows older than
/// `retention_us`; returns how many in all.
pub(crate) async fn prune(
    conn: &mut PgConnection,
    retention_us: i64,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    let inbox = prune_inbox(&mut *conn, retention_us, limit, now).await?;
    let mirror = delete_expired(
        conn,
        include_str!("sql/prune_event_mirror.sql"),
        retention_us,
        limit,
        now,
    )
    .await?;
    Ok(inbox + mirror)
}

/// Deletes up to `limit` inbox records older than `retention_us`.
pub(crate) async fn prune_inbox(
    conn: &mut PgConnection,
    retention_us: i64,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    delete_expired(
        conn,
        include_str!("sql/prune_inbox.sql"),
        retention_us,
        limit,
        now,
    )
    .await
}
