//! Statements about the consumers' inbox and emit_once's id records.

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

/// Deletes up to `limit` of emit_once's id records older than `max_age_us`.
pub(crate) async fn prune_event_ids(
    conn: &mut PgConnection,
    max_age_us: i64,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    super::delete_expired(
        conn,
        include_str!("sql/prune_event_ids.sql"),
        max_age_us,
        limit,
        now,
    )
    .await
}
