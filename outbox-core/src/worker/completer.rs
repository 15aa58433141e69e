//! Writes outcomes (TX2) in batches: whatever has queued up since the last
//! write goes in one statement, so batches grow with load and latency stays
//! low when idle. A write that fails is retried until it succeeds: an
//! outcome is never silently dropped.

use std::sync::Arc;

use tokio::sync::{broadcast, mpsc};

use super::Shared;
use super::events::{TaskEvent, TaskEventKind};
use super::executor::Done;
use super::outage::Outage;
use crate::db::{self, Finish};
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
    let mut buffer: Vec<Done> = Vec::with_capacity(cap);
    let mut outage = Outage::new("completer");
    loop {
        if done.recv_many(&mut buffer, cap).await == 0 {
            return; // every sender is gone and the queue is empty
        }
        let batch: Vec<Finish> = buffer.iter().map(|d| d.finish.clone()).collect();
        let mut tries_after_close = 0;
        let written = loop {
            match db::finish_tasks(&shared.pool, &batch, shared.config.clock.now()).await {
                Ok(written) => {
                    outage.ok();
                    break Some(written);
                }
                Err(error) => {
                    let backoff = outage.failed(&error);
                    if done.is_closed() {
                        tries_after_close += 1;
                        if tries_after_close >= SHUTDOWN_WRITE_ATTEMPTS {
                            break None;
                        }
                    }
                    tokio::time::sleep(backoff).await;
                }
            }
        };
        match written {
            Some(written) => publish(&events, &buffer, &written),
            None => tracing::error!(
                outcomes = buffer.len(),
                "could not write outcomes before exit; stuck-task recovery will rerun these tasks"
            ),
        }
        buffer.clear();
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
        metrics::counter!(TASKS_PROCESSED, "task_type" => d.task_type.to_string(), "outcome" => kind.as_str())
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
