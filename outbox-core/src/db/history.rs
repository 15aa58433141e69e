//! The history of successful tasks: its partitions, made ahead of time, and
//! its retention, which drops whole partitions.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// Creates the partitions that cover `now` through `ahead_us` later, each
/// `width_us` wide; returns how many were created.
pub(crate) async fn prepare(
    conn: &mut PgConnection,
    ahead_us: i64,
    width_us: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<i32> {
    sqlx::query_scalar(include_str!("sql/prepare_history.sql"))
        .bind(ahead_us)
        .bind(width_us)
        .bind(now)
        .fetch_one(conn)
        .await
}

/// Drops every partition whose tasks all finished over `retention_us` ago;
/// returns their names.
pub(crate) async fn drop_expired(
    conn: &mut PgConnection,
    retention_us: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(include_str!("sql/drop_history.sql"))
        .bind(retention_us)
        .bind(now)
        .fetch_all(conn)
        .await
}

/// Deletes one batch of expired rows from the default partition; returns
/// how many.
pub(crate) async fn cleanup_default(
    conn: &mut PgConnection,
    retention_us: i64,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    let done = sqlx::query(include_str!("sql/cleanup_history_default.sql"))
        .bind(retention_us)
        .bind(limit)
        .bind(now)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}
