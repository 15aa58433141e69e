//! Runs maintenance (stuck-task recovery, cleanup) on one worker of the
//! cluster at a time.
//!
//! Every worker campaigns for a session-level advisory lock on a dedicated
//! connection; the holder is the leader and runs maintenance on that same
//! connection. When the leader dies or loses its connection, the server
//! drops the lock and the next campaigning worker takes over within one
//! maintenance interval.

use std::sync::Arc;
use std::time::Instant;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::outage::Outage;
use crate::db;
use crate::maintenance::{DEFAULT_BATCH, cleanup_completed, recover_stuck};

/// An arbitrary constant naming the "outbox maintenance leader" lock.
const MAINTENANCE_LOCK_KEY: i64 = 0x6f75_7462_6f78_0002;

/// The application_name prefix of the leader's connection, so operators
/// (and tests) can see who leads in pg_stat_activity.
pub const MAINTENANCE_APPLICATION_NAME: &str = "outbox-maintenance";

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let options: PgConnectOptions = shared
        .pool
        .connect_options()
        .as_ref()
        .clone()
        .application_name(&format!(
            "{MAINTENANCE_APPLICATION_NAME} {}",
            shared.config.worker_id
        ));
    let mut outage = Outage::new("maintenance");
    loop {
        let connected = tokio::select! {
            c = options.connect() => c,
            () = stop.cancelled() => return,
        };
        let mut conn = match connected {
            Ok(conn) => conn,
            Err(error) => {
                let backoff = outage.failed(&error);
                if sleep_or_stop(backoff, &stop).await {
                    return;
                }
                continue;
            }
        };
        outage.ok();
        match campaign_and_lead(&shared, &mut conn, &stop).await {
            Ok(()) => {
                // Stopping: closing the session releases the lock at once.
                let _ = conn.close().await;
                return;
            }
            Err(error) => {
                let backoff = outage.failed(&error);
                drop(conn);
                if sleep_or_stop(backoff, &stop).await {
                    return;
                }
            }
        }
    }
}

/// Campaigns until elected, then leads until stopped. Returns `Ok` only
/// when stopped; any database error ends leadership (the caller drops the
/// connection, which releases the lock).
async fn campaign_and_lead(
    shared: &Shared,
    conn: &mut PgConnection,
    stop: &CancellationToken,
) -> sqlx::Result<()> {
    let interval = shared.config.maintenance_interval;
    while !db::try_lock_maintenance(conn, MAINTENANCE_LOCK_KEY).await? {
        if sleep_or_stop(interval, stop).await {
            return Ok(());
        }
    }
    tracing::info!(worker_id = %shared.config.worker_id, "elected maintenance leader");
    let mut last_cleanup: Option<Instant> = None;
    loop {
        let clock = &shared.config.clock;
        match recover_stuck(conn, shared.config.heartbeat_timeout, clock).await {
            Ok(report) => {
                if !report.recovered.is_empty() || !report.dead.is_empty() {
                    tracing::warn!(
                        recovered = ?report.recovered,
                        dead = ?report.dead,
                        "recovered tasks whose worker stopped heartbeating"
                    );
                }
            }
            Err(crate::Error::Database(e)) => return Err(e),
            Err(other) => tracing::error!(error = %other, "stuck-task recovery failed"),
        }
        if last_cleanup.is_none_or(|t| t.elapsed() >= shared.config.cleanup_interval) {
            match cleanup_completed(conn, shared.config.retention, DEFAULT_BATCH, clock).await {
                Ok(report) if report.deleted > 0 => {
                    tracing::info!(
                        deleted = report.deleted,
                        batches = report.batches,
                        "cleaned up completed tasks"
                    );
                }
                Ok(_) => {}
                Err(crate::Error::Database(e)) => return Err(e),
                Err(other) => tracing::error!(error = %other, "cleanup failed"),
            }
            last_cleanup = Some(Instant::now());
        }
        if sleep_or_stop(interval, stop).await {
            return Ok(());
        }
    }
}

/// Sleeps; true when stopped instead.
async fn sleep_or_stop(duration: std::time::Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(duration) => false,
        () = stop.cancelled() => true,
    }
}
