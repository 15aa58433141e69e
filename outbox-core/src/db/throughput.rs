//! The per-minute outcome counts behind the dashboard's throughput chart.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// One (minute, queue) count of outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MinuteCount {
    pub(crate) minute: DateTime<Utc>,
    pub(crate) queue: String,
    pub(crate) completed: i64,
    pub(crate) failed: i64,
}

/// Adds `counts` to worker `worker`'s rows.
pub(crate) async fn add(
    conn: &mut PgConnection,
    worker: &str,
    counts: &[MinuteCount],
) -> sqlx::Result<()> {
    sqlx::query(include_str!("sql/add_throughput.sql"))
        .bind(counts.iter().map(|c| c.minute).collect::<Vec<_>>())
        .bind(counts.iter().map(|c| c.queue.as_str()).collect::<Vec<_>>())
        .bind(counts.iter().map(|c| c.completed).collect::<Vec<_>>())
        .bind(counts.iter().map(|c| c.failed).collect::<Vec<_>>())
        .bind(worker)
        .execute(conn)
        .await?;
    Ok(())
}

/// Deletes counts older than a day; returns how many rows went.
pub(crate) async fn delete_old(
    conn: &mut PgConnection,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    Ok(sqlx::query(include_str!("sql/delete_old_throughput.sql"))
        .bind(now)
        .execute(conn)
        .await?
        .rows_affected())
}
