//! The history of successful tasks: its partitions, made ahead of time, and
//! its retention, which drops whole partitions.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// Creates the partitions that cover `now` through `ahead_us` later, each
/// `width_us` wide, one statement (and transaction) each, the furthest
/// first; returns how many were created. A partition that cannot be made
/// now (a lock not granted at once) does not stop the others: the first
/// such error is returned after trying them all.
pub(crate) async fn prepare(
    conn: &mut PgConnection,
    ahead_us: i64,
    width_us: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    super::cover_ahead(
        conn,
        include_str!("sql/cover_history.sql"),
        ahead_us,
        width_us,
        now,
    )
    .await
}

/// Drops every partition whose tasks all finished over `retention_us` ago,
/// one statement (and transaction) each, at most `limit`; returns their
/// names.
pub(crate) async fn drop_expired(
    conn: &mut PgConnection,
    retention_us: i64,
    limit: usize,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<Vec<String>> {
    let mut dropped = Vec::new();
    while dropped.len() < limit {
        let name: Option<String> = sqlx::query_scalar(include_str!("sql/drop_history.sql"))
            .bind(retention_us)
            .bind(now)
            .fetch_one(&mut *conn)
            .await?;
        match name {
            Some(name) => dropped.push(name),
            None => break,
        }
    }
    Ok(dropped)
}

/// Deletes one batch of expired rows from the default partition; returns
/// how many.
pub(crate) async fn cleanup_default(
    conn: &mut PgConnection,
    retention_us: i64,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    super::delete_expired(
        conn,
        include_str!("sql/cleanup_history_default.sql"),
        retention_us,
        limit,
        now,
    )
    .await
}
