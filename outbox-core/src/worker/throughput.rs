//! Counts this worker's committed outcomes per minute and queue in memory
//! and adds them to `outbox_throughput` every few seconds, so that operator
//! views can chart throughput without counting completed rows.
//!
//! These are statistics, not something owed to the database: counts that
//! could not be written (the database is away) are kept and added to the
//! next write, and what is still unwritten when the worker stops after one
//! last try is lost with it. A write whose reply was lost after its commit
//! is retried and counted twice; both are rare and the chart is an
//! approximation either way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::outage::Outage;
use crate::db::session::call;
use crate::db::throughput::{self, MinuteCount};

/// How often counts are written.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// The longest the last write at shutdown may take.
const LAST_FLUSH: Duration = Duration::from_secs(1);

/// (completed, failed) by (minute, queue).
type Counts = HashMap<(DateTime<Utc>, Arc<str>), (i64, i64)>;

/// Outcome counts not yet written.
#[derive(Default)]
pub(crate) struct Throughput {
    pending: Mutex<Counts>,
}

impl Throughput {
    /// Counts committed outcomes at `now`: `(queue, completed)` for each.
    pub(crate) fn record<'a>(
        &self,
        now: DateTime<Utc>,
        outcomes: impl IntoIterator<Item = (&'a Arc<str>, bool)>,
    ) {
        let minute = now.duration_trunc(TimeDelta::minutes(1)).unwrap_or(now);
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (queue, completed) in outcomes {
            let entry = pending.entry((minute, Arc::clone(queue))).or_default();
            if completed {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
    }

    fn take(&self) -> Vec<MinuteCount> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending
            .drain()
            .map(|((minute, queue), (completed, failed))| MinuteCount {
                minute,
                queue: queue.to_string(),
                completed,
                failed,
            })
            .collect()
    }

    /// Puts counts whose write failed back, to go with the next one.
    fn put_back(&self, counts: Vec<MinuteCount>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for c in counts {
            let entry = pending
                .entry((c.minute, Arc::from(c.queue.as_str())))
                .or_default();
            entry.0 += c.completed;
            entry.1 += c.failed;
        }
    }
}

/// Writes the counts every [`FLUSH_EVERY`] until `stop`.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut outage = Outage::new("throughput");
    loop {
        tokio::select! {
            () = tokio::time::sleep(FLUSH_EVERY) => {}
            () = stop.cancelled() => return,
        }
        match flush(&shared, shared.deadline).await {
            Ok(()) => outage.ok(),
            Err(error) => {
                let _ = outage.failed(&error);
            }
        }
    }
}

/// The last write at shutdown, within the flush deadline (so shutdown
/// stays within its documented bound): skipped when that has passed, as it
/// has when the database is away.
pub(crate) async fn last_flush(shared: &Shared, flush_over: tokio::time::Instant) {
    let left = flush_over.saturating_duration_since(tokio::time::Instant::now());
    if left.is_zero() {
        return;
    }
    if let Err(error) = flush(shared, left.min(LAST_FLUSH)).await {
        tracing::debug!(%error, "outcome counts of the last seconds not written at shutdown");
    }
}

async fn flush(shared: &Shared, deadline: Duration) -> sqlx::Result<()> {
    let counts = shared.throughput.take();
    if counts.is_empty() {
        return Ok(());
    }
    let worker = &shared.config.worker_id;
    let written = call(&shared.engine, deadline, "throughput", async |conn| {
        throughput::add(conn, worker, &counts).await
    })
    .await;
    if written.is_err() {
        shared.throughput.put_back(counts);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_per_minute_and_queue_and_survive_a_failed_write() {
        let t = Throughput::default();
        let q: Arc<str> = Arc::from("mail");
        let at = DateTime::parse_from_rfc3339("2026-11-22T10:00:30Z")
            .unwrap()
            .with_timezone(&Utc);
        t.record(at, [(&q, true), (&q, true), (&q, false)]);
        t.record(at + TimeDelta::seconds(40), [(&q, true)]);
        let mut taken = t.take();
        taken.sort_by_key(|c| c.minute);
        assert_eq!(taken.len(), 2);
        assert_eq!((taken[0].completed, taken[0].failed), (2, 1));
        assert_eq!(taken[1].minute.timestamp() % 60, 0);
        t.put_back(taken);
        t.record(at, [(&q, true)]);
        let mut again = t.take();
        again.sort_by_key(|c| c.minute);
        assert_eq!((again[0].completed, again[0].failed), (3, 1));
        assert!(t.take().is_empty());
    }
}
