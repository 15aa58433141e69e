//! Maintenance: stuck-task recovery and cleanup of completed history.
//!
//! Workers run these on one leader per cluster (see the worker's
//! maintainer); operators and tests can also call them directly. Both are
//! safe to run concurrently: they lock rows with SKIP LOCKED and touch each
//! row once.

use std::time::Duration;

use sqlx::PgConnection;

use crate::clock::Clock;
use crate::db;
use crate::error::Result;
use crate::options::delay_micros;
use crate::task::TaskId;

/// Rows one recovery or cleanup statement touches at most.
pub const DEFAULT_BATCH: i64 = 1000;

/// What a recovery pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Tasks made claimable again.
    pub recovered: Vec<TaskId>,
    /// Tasks that had no attempts left and are now dead.
    pub dead: Vec<TaskId>,
}

/// Returns every PROCESSING task whose heartbeat is older than `timeout` to
/// the claimable state (or to dead, when it has no attempts left), counting
/// the lost attempt.
pub async fn recover_stuck(
    conn: &mut PgConnection,
    timeout: Duration,
    clock: &Clock,
) -> Result<RecoveryReport> {
    Ok(recover_stuck_as(conn, delay_micros(timeout)?, clock, None).await?)
}

/// [`recover_stuck`] with the timeout in microseconds, run by `leader` (the
/// holder of the maintenance lease: nothing changes once it lost the
/// lease), or by anyone when `None`.
pub(crate) async fn recover_stuck_as(
    conn: &mut PgConnection,
    timeout_us: i64,
    clock: &Clock,
    leader: Option<&str>,
) -> sqlx::Result<RecoveryReport> {
    let mut report = RecoveryReport::default();
    loop {
        let rows = db::recover_stuck(conn, timeout_us, DEFAULT_BATCH, clock.now(), leader).await?;
        let full = rows.len() as i64 == DEFAULT_BATCH;
        for (id, dead) in rows {
            if dead {
                report.dead.push(TaskId(id));
            } else {
                report.recovered.push(TaskId(id));
            }
        }
        if !full {
            return Ok(report);
        }
    }
}

/// What a cleanup pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Rows deleted.
    pub deleted: u64,
    /// DELETE statements run (each touches at most the batch size).
    pub batches: u64,
}

/// Deletes COMPLETED tasks that finished more than `retention` ago, at most
/// `batch` rows per statement, until none are left. FAILED rows are kept.
pub async fn cleanup_completed(
    conn: &mut PgConnection,
    retention: Duration,
    batch: i64,
    clock: &Clock,
) -> Result<CleanupReport> {
    let (report, _) =
        cleanup_completed_us(conn, delay_micros(retention)?, batch, clock, None).await?;
    Ok(report)
}

/// [`cleanup_completed`] with the retention in microseconds, starting no
/// new batch once `budget` has passed; also says whether it finished.
pub(crate) async fn cleanup_completed_us(
    conn: &mut PgConnection,
    retention_us: i64,
    batch: i64,
    clock: &Clock,
    budget: Option<Duration>,
) -> sqlx::Result<(CleanupReport, bool)> {
    let started = std::time::Instant::now();
    let batch = batch.max(1);
    let mut report = CleanupReport::default();
    loop {
        let deleted = db::cleanup_completed(conn, retention_us, batch, clock.now()).await?;
        report.batches += 1;
        report.deleted += deleted;
        if deleted < batch as u64 {
            return Ok((report, true));
        }
        if budget.is_some_and(|b| started.elapsed() >= b) {
            return Ok((report, false));
        }
    }
}
