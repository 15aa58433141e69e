//! Makes this worker visible: its row in `outbox_workers` (id, host, pid,
//! queues with their concurrency, started, last seen) is written at start
//! and renewed every heartbeat interval, and removed at a clean shutdown.
//! A worker that dies stops renewing it; the row then shows it gone, and
//! maintenance removes it after `forget_workers_after`. At start it also
//! declares the task types registered in its binary, for `outbox_submit`.
//!
//! A failed write is tried again at the next interval (the row only has to
//! be renewed before it expires, three intervals on).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Shared;
use super::outage::Outage;
use crate::db::session::call;
use crate::db::workers::{self, WorkerIdentity};
use crate::options::delay_micros;
use crate::records::WorkerQueue;

/// How long a worker's row stays alive without a renewal, in heartbeat
/// intervals.
const ALIVE_INTERVALS: u32 = 3;

/// The identity this worker reports, serving `queues`.
pub(crate) fn identity(shared: &Shared, queues: &[(String, usize)]) -> WorkerIdentity {
    let queues: Vec<WorkerQueue> = queues
        .iter()
        .map(|(queue, concurrency)| WorkerQueue {
            queue: queue.clone(),
            concurrency: u32::try_from(*concurrency).unwrap_or(u32::MAX),
        })
        .collect();
    WorkerIdentity {
        id: shared.holdings.run_id().to_owned(),
        host: super::config::host_name(),
        pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
        queues: serde_json::to_string(&queues).unwrap_or_else(|_| "[]".to_owned()),
    }
}

/// Declares the task types registered in this binary, for
/// `outbox_submit`; true once done. Apart from the worker's row: a
/// database without migration 14, or a role that may not write
/// `outbox_task_types`, costs submits from SQL their declarations, not the
/// worker its place in the list. Tried again at each renewal, reported the
/// first time and every hundredth.
async fn declare(shared: &Shared, failures: &mut u32) -> bool {
    let types = crate::task::registered_tasks();
    let result = call(
        &shared.engine,
        shared.deadline,
        "task types",
        async |conn| workers::declare_task_types(conn, &types).await,
    )
    .await;
    match result {
        Ok(()) => true,
        Err(error) => {
            if failures.is_multiple_of(100) {
                tracing::warn!(
                    %error,
                    "could not declare this binary's task types for outbox_submit (is migration 14 applied?); trying again"
                );
            }
            *failures += 1;
            false
        }
    }
}

pub(crate) async fn run(shared: Arc<Shared>, me: WorkerIdentity, stop: CancellationToken) {
    let interval = shared.config.heartbeat_interval;
    let ttl = (interval * ALIVE_INTERVALS).max(Duration::from_secs(3));
    let ttl_us = delay_micros(ttl).unwrap_or(i64::MAX);
    let mut outage = Outage::new("worker row");
    let mut first = true;
    let mut declared = false;
    let mut declare_failures = 0_u32;
    loop {
        let write = call(
            &shared.engine,
            shared.deadline,
            "worker row",
            async |conn| workers::register(conn, &me, first, ttl_us).await,
        );
        let wait = tokio::select! {
            r = write => match r {
                Ok(()) => {
                    outage.ok();
                    first = false;
                    if !declared {
                        declared = declare(&shared, &mut declare_failures).await;
                    }
                    interval
                }
                Err(error) => outage.failed(&error).min(interval),
            },
            () = stop.cancelled() => break,
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => break,
        }
    }
    // Leaving cleanly: the row goes now rather than showing a dead worker.
    let leave = call(&shared.engine, LEAVE_DEADLINE, "worker row", async |conn| {
        workers::forget(conn, &me.id).await
    });
    if let Err(error) = leave.await {
        tracing::info!(%error, "could not remove this worker's row; it expires by itself");
    }
}

/// A shutdown removes the worker's row with this much patience at most.
const LEAVE_DEADLINE: Duration = Duration::from_secs(1);
