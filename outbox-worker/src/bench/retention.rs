//! The bench's retention figure: a day of completed tasks in the history,
//! past the retention, removed by the same cleanup the maintenance leader
//! runs. It drops the day's partition whole, so its time does not grow
//! with the rows, and it deletes none.

use std::time::{Duration, Instant};

use outbox::Clock;
use serde::Serialize;

use super::{Bench, db};
use crate::failure::Failure;

/// What the retention phase measured.
#[derive(Debug, Serialize)]
pub(crate) struct RetentionReport {
    /// Completed tasks of the expired day.
    rows: u64,
    /// The cleanup call, from start to its return.
    pub(super) seconds: f64,
    /// Rows it deleted one by one (the figure says none).
    pub(super) rows_deleted: u64,
    pub(super) partitions_dropped: usize,
}

const DAY: Duration = Duration::from_secs(86_400);

pub(crate) async fn measure(bench: &Bench, rows: u64) -> Result<RetentionReport, Failure> {
    let mut conn = bench.pool.acquire().await.map_err(db)?;
    // A day's partition thirty days ago, made then by the leader, and that
    // day's tasks in it.
    let day = chrono::Utc::now() - chrono::Duration::days(30);
    outbox::maintenance::prepare_history(&mut conn, DAY, &Clock::fixed(day)).await?;
    sqlx::query(include_str!("sql/prefill_expired_day.sql"))
        .bind(i64::try_from(rows).unwrap_or(i64::MAX))
        .bind(day)
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    let started = Instant::now();
    let report =
        outbox::maintenance::cleanup_completed(&mut conn, 7 * DAY, 1000, &Clock::database())
            .await?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(RetentionReport {
        rows,
        seconds,
        rows_deleted: report.deleted,
        partitions_dropped: report.partitions_dropped.len(),
    })
}
