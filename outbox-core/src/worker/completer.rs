//! Writes outcomes (TX2) in batches: whatever has queued up since the last
//! write goes in one statement, so batches grow with load and latency stays
//! low when idle. Up to `finish_lanes` writes are in flight at once, so the
//! wait for one commit's WAL flush overlaps the next batch (and PostgreSQL
//! can flush them together). A write that fails is retried until it
//! succeeds: an outcome is never silently dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinSet;

use super::Shared;
use super::events::{TaskEvent, TaskEventKind};
use super::executor::Done;
use super::outage::Outage;
use crate::db::{self, Finish, NextState};
use crate::task::TaskId;

/// How many times a batch is retried once shutdown has begun, before its
/// tasks are left to stuck-task recovery.
const SHUTDOWN_WRITE_ATTEMPTS: u32 = 20;

pub(crate) async fn run(
    shared: Arc<Shared>,
    mut done: mpsc::Receiver<Done>,
    events: broadcast::Sender<TaskEvent>,
) {
    let cap = shared.config.max_finish_batch.max(1);
    let lanes = shared.config.finish_lanes.max(1);
    let writer = Arc::new(Writer {
        shared: Arc::clone(&shared),
        outage: Mutex::new(Outage::new("completer")),
        closing: AtomicBool::new(false),
    });
    let mut writes = JoinSet::new();
    loop {
        while writes.len() >= lanes {
            let _ = writes.join_next().await;
        }
        let mut buffer: Vec<Done> = Vec::with_capacity(cap);
        if done.recv_many(&mut buffer, cap).await == 0 {
            break; // every sender is gone and the queue is empty
        }
        let writer = Arc::clone(&writer);
        let events = events.clone();
        writes.spawn(async move {
            match writer.write(&buffer).await {
                Some(written) => publish(&events, &buffer, &written),
                None => tracing::error!(
                    outcomes = buffer.len(),
                    "could not write outcomes before exit; stuck-task recovery will rerun these tasks"
                ),
            }
        });
    }
    writer.closing.store(true, Ordering::Relaxed);
    while writes.join_next().await.is_some() {}
}

/// Writes batches, retrying through outages.
struct Writer {
    shared: Arc<Shared>,
    outage: Mutex<Outage>,
    /// Set once no more outcomes can arrive: retries are then bounded.
    closing: AtomicBool,
}

impl Writer {
    /// Writes `batch`: successes through the fast path, anything else
    /// through the general statement. Returns the ids written, or `None`
    /// when the worker is stopping and the database stayed away.
    async fn write(&self, batch: &[Done]) -> Option<Vec<i64>> {
        let (successes, others): (Vec<&Finish>, Vec<&Finish>) = batch
            .iter()
            .map(|d| &d.finish)
            .partition(|f| f.state == NextState::Completed);
        let mut written = Vec::with_capacity(batch.len());
        if !successes.is_empty() {
            written.extend(self.write_part(&successes).await?);
        }
        if !others.is_empty() {
            written.extend(self.write_part(&others).await?);
        }
        Some(written)
    }

    /// Writes outcomes that all go through the same statement, retrying
    /// through outages.
    async fn write_part(&self, part: &[&Finish]) -> Option<Vec<i64>> {
        let mut tries_after_close = 0;
        loop {
            self.shared.counters.finished(part.len());
            match self.statement(part).await {
                Ok(written) => {
                    self.outage().ok();
                    return Some(written);
                }
                // The server rejected the statement itself (not the
                // connection): one outcome must be unwritable. Write them
                // one by one so that it cannot hold back the others.
                Err(sqlx::Error::Database(error)) if part.len() > 1 => {
                    tracing::error!(%error, outcomes = part.len(), "a batch of outcomes was rejected; writing them one by one");
                    let mut written = Vec::with_capacity(part.len());
                    for one in part {
                        written.extend(Box::pin(self.write_part(std::slice::from_ref(one))).await?);
                    }
                    return Some(written);
                }
                Err(sqlx::Error::Database(error)) => {
                    tracing::error!(
                        task_id = part.first().map(|f| f.id),
                        %error,
                        "the database rejected this outcome; the task is left to stuck-task recovery"
                    );
                    return Some(Vec::new());
                }
                Err(error) => {
                    let backoff = self.outage().failed(&error);
                    if self.closing.load(Ordering::Relaxed) {
                        tries_after_close += 1;
                        if tries_after_close >= SHUTDOWN_WRITE_ATTEMPTS {
                            return None;
                        }
                    }
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }

    /// One statement for `part`: the fast path when every outcome is a
    /// success.
    async fn statement(&self, part: &[&Finish]) -> sqlx::Result<Vec<i64>> {
        let config = &self.shared.config;
        if part.iter().all(|f| f.state == NextState::Completed) {
            let ids = part.iter().map(|f| f.id).collect();
            let claims = part.iter().map(|f| f.claims).collect();
            db::complete_tasks(
                &self.shared.pool,
                ids,
                claims,
                config.delete_completed,
                config.clock.now(),
            )
            .await
        } else {
            db::finish_tasks(&self.shared.pool, part, config.clock.now()).await
        }
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, Outage> {
        self.outage.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Counter of committed outcomes, by task type and outcome.
pub(crate) const TASKS_PROCESSED: &str = "outbox_tasks_processed_total";

/// Counts committed outcomes and tells subscribers, only now that TX2 has
/// committed.
fn publish(events: &broadcast::Sender<TaskEvent>, batch: &[Done], written: &[i64]) {
    let written: std::collections::HashSet<i64> = written.iter().copied().collect();
    let subscribed = events.receiver_count() > 0;
    for d in batch {
        let kind = if written.contains(&d.finish.id) {
            d.kind
        } else {
            TaskEventKind::Stale
        };
        metrics::counter!(TASKS_PROCESSED, "task_type" => Arc::clone(&d.task_type), "outcome" => kind.as_str())
            .increment(1);
        if subscribed {
            let _ = events.send(TaskEvent {
                id: TaskId(d.finish.id),
                task_type: d.task_type.to_string(),
                kind,
            });
        }
    }
}
