//! Maintenance: stuck-task recovery, the history's partitions, and
//! cleanup of completed history.
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Rows deleted: completed tasks that `outbox_tasks` kept because their
    /// uniqueness covers COMPLETED, and history rows that finished while no
    /// partition covered their time.
    pub deleted: u64,
    /// DELETE statements run (each touches at most the batch size).
    pub batches: u64,
    /// History partitions dropped whole, by name.
    pub partitions_dropped: Vec<String>,
}

/// Removes the completed tasks that finished more than `retention` ago:
/// drops every history partition whose tasks all did (no row is deleted;
/// a partition goes once its end is `retention` old, so a task is kept for
/// between `retention` and `retention` plus a partition's width), then
/// deletes the rest in statements of at most `batch` rows until none are
/// left. FAILED and dead tasks are kept.
pub async fn cleanup_completed(
    conn: &mut PgConnection,
    retention: Duration,
    batch: i64,
    clock: &Clock,
) -> Result<CleanupReport> {
    let retention_us = delay_micros(retention)?;
    let dropped = db::history::drop_expired(conn, retention_us, usize::MAX, clock.now()).await?;
    let (mut report, _) = cleanup_completed_us(conn, retention_us, batch, clock, None).await?;
    report.partitions_dropped = dropped;
    Ok(report)
}

/// The row-by-row part of [`cleanup_completed`] with the retention in
/// microseconds, starting no new batch once `budget` has passed; also says
/// whether it finished.
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
    // outbox_tasks first, then the history's default partition; each until
    // a statement finds less than a full batch.
    let mut live_done = false;
    loop {
        let deleted = if live_done {
            db::history::cleanup_default(conn, retention_us, batch, clock.now()).await?
        } else {
            db::cleanup_completed(conn, retention_us, batch, clock.now()).await?
        };
        report.batches += 1;
        report.deleted += deleted;
        if deleted < batch as u64 {
            if live_done {
                return Ok((report, true));
            }
            live_done = true;
        }
        if budget.is_some_and(|b| started.elapsed() >= b) {
            return Ok((report, false));
        }
    }
}

/// Creates the history partitions that cover the time from now until two
/// partition widths ahead, each `width` wide (at least a minute; aligned to
/// multiples of it since the Unix epoch, so daily partitions start at
/// midnight UTC); returns how many it created. The maintenance leader runs
/// it at every cleanup; until it has, tasks land in the default partition,
/// and the partition made later takes them over.
pub async fn prepare_history(
    conn: &mut PgConnection,
    width: Duration,
    clock: &Clock,
) -> Result<u64> {
    check_history_partition(width)?;
    Ok(prepare_history_us(conn, delay_micros(width)?, clock.now()).await?)
}

/// [`prepare_history`] with the width in microseconds (already checked).
pub(crate) async fn prepare_history_us(
    conn: &mut PgConnection,
    width_us: i64,
    now: Option<chrono::DateTime<chrono::Utc>>,
) -> sqlx::Result<u64> {
    db::history::prepare(conn, width_us.saturating_mul(2), width_us, now).await
}

/// The narrowest history partition: one a minute.
pub const MIN_HISTORY_PARTITION: Duration = Duration::from_secs(60);

/// The widest history partition: a year.
pub const MAX_HISTORY_PARTITION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Refuses a partition width outside [`MIN_HISTORY_PARTITION`] to
/// [`MAX_HISTORY_PARTITION`].
pub(crate) fn check_history_partition(width: Duration) -> Result<()> {
    if (MIN_HISTORY_PARTITION..=MAX_HISTORY_PARTITION).contains(&width) {
        Ok(())
    } else {
        Err(crate::error::Error::InvalidOption(format!(
            "a history partition of {width:?} is out of range: use a minute to 366 days"
        )))
    }
}
