//! Statements about the consumers' inbox.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// Deletes up to `limit` inbox records older than `retention_us`.
pub(crate) async fn prune_inbox(
    conn: &mut PgConnection,
    retention_us: i64,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    super::delete_expired(
        conn,
        include_str!("sql/prune_inbox.sql"),
        retention_us,
        limit,
        now,
    )
    .await
}
