//! Writes outcomes (TX2) in batches: whatever has queued up since the last
//! write goes in one statement, so batches grow with load and latency stays
//! low when idle. Outcomes are written in `finish_lanes` lanes, each one
//! statement at a time, so the wait for one commit's WAL flush overlaps
//! another lane's batch (and PostgreSQL can flush them together).
//!
//! Every outcome of one workflow goes down the same lane. Its statement
//! settles the workflow, which locks the workflow's row until the commit:
//! two lanes holding steps of the same workflows (the parts of a group end
//! together) would each wait for the other's commit, and the lanes would
//! run one after the other. Other outcomes are spread by task id.
//!
//! An outcome is never dropped for a transient error: its write is retried
//! with backoff on a fresh connection for as long as the worker runs, its
//! task stays in the worker's holdings (and so keeps being heartbeated),
//! and once a lane busy retrying has a full backlog no more outcomes are
//! taken in, which stops the executor and so the claims (backpressure).
//! Only a permanent error for one outcome ends it, as a visible failure on
//! the row. At shutdown the writes get until the flush deadline; what is
//! still unwritten then is logged with its task ids and released at exit
//! or, if the database stays away, left to stuck-task recovery.
//!
//! An outcome waits for another transaction's lock on an ordering key 50 ms
//! at most: a key it cannot take by then is handed on later, by
//! [`deferred_keys`](super::deferred_keys).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::claim_ahead::Buffered;
use super::deferred_keys;
use super::events::{TaskEvent, TaskEventKind};
use super::executor::Done;
use super::outage::Outage;
use super::runs;
use crate::db::{self, Finish, NextState, classify::is_transient, session::call};
use crate::task::TaskId;

pub(crate) async fn run(
    shared: Arc<Shared>,
    mut done: mpsc::Receiver<Done>,
    events: broadcast::Sender<TaskEvent>,
    give_up: CancellationToken,
) {
    let cap = shared.config.max_finish_batch.max(1);
    let lanes = shared.config.finish_lanes.max(1);
    let (owe_keys, owed_keys) = mpsc::unbounded_channel();
    let mut writes = JoinSet::new();
    // Ends once every lane has (closing the channel) and no key is owed.
    writes.spawn(deferred_keys::run(
        Arc::clone(&shared),
        owed_keys,
        give_up.clone(),
    ));
    let writer = Arc::new(Writer {
        shared: Arc::clone(&shared),
        outage: std::sync::Mutex::new(Outage::new("completer")),
        give_up,
        owe_keys,
    });
    let mut senders = Vec::with_capacity(lanes);
    for _ in 0..lanes {
        // A lane's backlog is one batch: a lane that cannot write (an
        // outage) soon stops the intake here.
        let (sender, backlog) = mpsc::channel(cap);
        senders.push(sender);
        writes.spawn(lane(Arc::clone(&writer), backlog, events.clone(), cap));
    }
    loop {
        let next = tokio::select! {
            d = done.recv() => d,
            // A handler that never returns keeps its sender alive: at the
            // flush deadline stop waiting for it (its task is still held
            // and is released at exit).
            () = writer.give_up.cancelled() => None,
        };
        // None: every sender is gone and the queue is empty.
        let Some(d) = next else { break };
        let to = lane_of(d.workflow_id, d.finish.id, lanes);
        // Refused only once the lane gave up at the flush deadline; the
        // task is still held and is released at exit.
        if senders[to].send(d).await.is_err() {
            break;
        }
    }
    // Each lane writes what it has left, then ends.
    drop(senders);
    drop(writer);
    while writes.join_next().await.is_some() {}
}

/// One lane: writes whatever its backlog holds, one statement at a time.
async fn lane(
    writer: Arc<Writer>,
    mut backlog: mpsc::Receiver<Done>,
    events: broadcast::Sender<TaskEvent>,
    cap: usize,
) {
    loop {
        let mut buffer: Vec<Done> = Vec::with_capacity(cap);
        let received = tokio::select! {
            n = backlog.recv_many(&mut buffer, cap) => n,
            () = writer.give_up.cancelled() => 0,
        };
        if received == 0 {
            break;
        }
        let parts = writer.write(&buffer).await;
        publish(&writer.shared, &events, &buffer, &parts);
        writer.go_on(buffer, &parts).await;
    }
}

/// The lane an outcome is written in: its workflow's, so that no two lanes
/// wait for each other on one workflow's locks; otherwise its task's, which
/// spreads plain outcomes evenly.
fn lane_of(workflow_id: Option<i64>, task_id: i64, lanes: usize) -> usize {
    let key = workflow_id.unwrap_or(task_id);
    let lanes = i64::try_from(lanes.max(1)).unwrap_or(i64::MAX);
    usize::try_from(key.rem_euclid(lanes)).unwrap_or(0)
}

/// What became of each outcome of a batch.
#[derive(Debug, Default)]
struct Written {
    /// Written as the handler said.
    ids: Vec<i64>,
    /// Rejected for good; the attempt was recorded as failed instead.
    rejected: Vec<i64>,
    /// Not written before the flush deadline: the task is still held.
    unwritten: Vec<i64>,
    /// Queues where a key went on to a task nobody here claimed yet: their
    /// producer looks for it now rather than at the next poll.
    wake: HashSet<Arc<str>>,
    /// Written, but their runs end here (see `db::Completed::halted`).
    halted: Vec<i64>,
    /// Written dead: an operator's cancel met the outcome in the database
    /// (see `db::Completed::cancelled`).
    cancelled: Vec<i64>,
}

/// Writes batches, retrying through outages.
struct Writer {
    shared: Arc<Shared>,
    outage: std::sync::Mutex<Outage>,
    /// Cancelled at the flush deadline of a shutdown: stop retrying.
    give_up: CancellationToken,
    /// Keys let go of that an outcome could not hand on.
    owe_keys: mpsc::UnboundedSender<db::QueueKey>,
}

impl Writer {
    /// Writes `batch`: successes through the fast path, anything else
    /// through the general statement.
    async fn write(&self, batch: &[Done]) -> Written {
        let (successes, others): (Vec<&Done>, Vec<&Done>) = batch
            .iter()
            // Successes with a result go through the general statement,
            // which stores it.
            .partition(|d| fast_path(&d.finish));
        let mut written = Written::default();
        for part in [successes, others] {
            if !part.is_empty() {
                self.write_part(&part, &mut written).await;
            }
        }
        written
    }

    /// Writes outcomes that all go through the same statement.
    async fn write_part(&self, part: &[&Done], written: &mut Written) {
        match self.retrying("outcome", || self.statement(part)).await {
            Some(Ok(done)) => {
                self.shared.counters.deferred(done.deferred.len());
                for key in done.deferred {
                    // Closed only after every lane has ended.
                    let _ = self.owe_keys.send(key);
                }
                written.ids.extend(done.written);
                written.halted.extend(done.halted);
                written.cancelled.extend(done.cancelled);
                written.wake.extend(done.woken.into_iter().map(Arc::from));
            }
            None => written.unwritten.extend(part.iter().map(|d| d.finish.id)),
            // The server refused the statement itself: one outcome must be
            // unwritable. Write them one by one so that it cannot hold back
            // the others.
            Some(Err(error)) if part.len() > 1 => {
                tracing::error!(%error, outcomes = part.len(), "a batch of outcomes was rejected; writing them one by one");
                for one in part {
                    Box::pin(self.write_part(std::slice::from_ref(one), written)).await;
                }
            }
            Some(Err(error)) => self.reject(&part[0].finish, &error, written).await,
        }
    }

    /// One outcome was rejected for good: record the attempt as failed with
    /// the rejection as its error, so the row says what happened.
    async fn reject(&self, finish: &Finish, error: &sqlx::Error, written: &mut Written) {
        let message = format!("the database rejected this attempt's outcome: {error}");
        tracing::error!(task_id = finish.id, %error, "outcome rejected; recording the attempt as failed");
        let shared = &self.shared;
        let fallback = self
            .retrying("rejected outcome", || {
                call(&shared.engine, shared.deadline, "outcome", async |conn| {
                    db::fail_unwritable(conn, finish, &message).await
                })
            })
            .await;
        match fallback {
            Some(Ok(true)) => written.rejected.push(finish.id),
            // Fenced out: the task is no longer this attempt's.
            Some(Ok(false)) => {}
            Some(Err(error)) => {
                // Even the bare failure was refused; stop holding the task
                // so stuck-task recovery returns it after the timeout.
                tracing::error!(task_id = finish.id, %error, "could not record the rejected outcome either; stuck-task recovery will return the task");
            }
            None => written.unwritten.push(finish.id),
        }
    }

    /// Runs `attempt` until it succeeds or fails permanently (`Some`), or
    /// until the flush deadline of a shutdown passes (`None`).
    async fn retrying<T, F, Fut>(
        &self,
        what: &'static str,
        mut attempt: F,
    ) -> Option<sqlx::Result<T>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = sqlx::Result<T>>,
    {
        loop {
            let result = tokio::select! {
                r = attempt() => r,
                () = self.give_up.cancelled() => return None,
            };
            match result {
                Ok(value) => {
                    self.outage().ok();
                    return Some(Ok(value));
                }
                Err(error) if is_transient(&error) => {
                    let backoff = self.outage().failed(&error);
                    tracing::debug!(what, %error, ?backoff, "write failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = self.give_up.cancelled() => return None,
                    }
                }
                Err(error) => return Some(Err(error)),
            }
        }
    }

    /// One statement for `part`: the fast path when every outcome is a
    /// success, which may also hand ordering keys straight on to their next
    /// tasks here (see `hand_on`).
    async fn statement(&self, part: &[&Done]) -> sqlx::Result<db::Completed> {
        let shared = &self.shared;
        let config = &shared.config;
        shared.counters.finished(part.len());
        let now = config.clock.now();
        // Tasks whose run goes on here keep their key (worker/runs.rs);
        // once claiming stopped, every run is given back instead.
        let continuing: Vec<(i64, i64)> = if shared.hand_on.stopped() {
            Vec::new()
        } else {
            part.iter()
                .filter_map(|d| {
                    let (run, _) = d.run.as_ref()?;
                    Some((d.finish.id, run.first()?.id))
                })
                .collect()
        };
        if !part.iter().all(|d| fast_path(&d.finish)) {
            let finishes: Vec<&Finish> = part.iter().map(|d| &d.finish).collect();
            let mut done = call(&shared.engine, shared.deadline, "outcome", async |conn| {
                db::finish_tasks(conn, &finishes, now, &continuing).await
            })
            .await?;
            // A failure can let go of a key too (a dead task of a type that
            // skips them): look for the key's next task at once.
            done.woken = part
                .iter()
                .filter(|d| d.ordered && done.written.contains(&d.finish.id))
                .map(|d| d.queue.to_string())
                .collect();
            return Ok(done);
        }
        let finishes: Vec<&Finish> = part.iter().map(|d| &d.finish).collect();
        // A task whose run goes on keeps its key: nothing to hand on. Any
        // other ordered success may hand its key straight on, with the run
        // behind the key's next task (migration 46); the last task of a run
        // too, whose key would otherwise go back to its line until the
        // producer, woken, claimed it.
        let offer = shared.hand_on.offer(
            &shared.holdings,
            part.iter()
                .filter(|d| d.ordered && d.run.is_none())
                .map(|d| &*d.queue),
        );
        let result = call(&shared.engine, shared.deadline, "outcome", async |conn| {
            db::complete_tasks(
                conn,
                &finishes,
                config.delete_completed,
                now,
                offer.as_ref().map(|o| &o.offer),
                &continuing,
            )
            .await
        })
        .await;
        match (result, offer) {
            (Ok(mut done), Some(offer)) => {
                let claimed = std::mem::take(&mut done.claimed);
                let n = offer.deliver(&shared.hand_on, &shared.holdings, claimed);
                shared.counters.handed_on(n);
                Ok(done)
            }
            (Ok(done), None) => Ok(done),
            (Err(error), offer) => {
                if let Some(offer) = offer {
                    offer.fail(&shared.holdings, &error);
                }
                Err(error)
            }
        }
    }

    /// Once a batch is settled: starts the next task of each run whose
    /// task is done, and gives back the rest of the others (see
    /// worker/runs.rs).
    async fn go_on(&self, batch: Vec<Done>, written: &Written) {
        if batch.iter().all(|d| d.run.is_none()) {
            return;
        }
        let shared = &self.shared;
        let ids: HashSet<i64> = written.ids.iter().copied().collect();
        let mut give_back: Vec<(i64, Arc<str>)> = Vec::new();
        for d in batch {
            if d.run.is_none() {
                continue;
            }
            let id = d.finish.id;
            // A task an operator's cancel made dead ends its run as a
            // cancel the worker heard of does (the rest goes back).
            let as_said = ids.contains(&id) && !written.cancelled.contains(&id);
            let settled = match runs::next(&d, as_said, written.unwritten.contains(&id)) {
                // The run ends here (its queue paused or given limits, or its
                // next task no longer ours), or claiming stopped.
                runs::Next::GoOn if written.halted.contains(&id) || shared.hand_on.stopped() => {
                    runs::Next::GiveBack
                }
                settled => settled,
            };
            let Some((mut run, waiting)) = d.run else {
                continue;
            };
            match settled {
                runs::Next::Hold => {}
                runs::Next::GiveBack => give_back.extend(run.iter().flat_map(|t| t.held())),
                runs::Next::GoOn => {
                    let mut task = run.remove(0);
                    task.run = run;
                    let capacity = waiting.resume();
                    match shared.hand_on.run_on(Buffered { task, capacity }) {
                        Ok(()) => shared.counters.run_on(),
                        // The dispatcher stopped (shutdown).
                        Err(held) => give_back.extend(held),
                    }
                }
            }
        }
        if give_back.is_empty() {
            return;
        }
        let released = self
            .retrying("run release", || {
                call(&shared.engine, shared.deadline, "release", async |conn| {
                    db::release_run(conn, &give_back).await
                })
            })
            .await;
        match released {
            // Still held: released at exit, or recovered.
            None => return,
            Some(Ok((_, deferred))) => {
                self.shared.counters.deferred(deferred.len());
                for key in deferred {
                    // Closed only after every lane has ended.
                    let _ = self.owe_keys.send(key);
                }
            }
            Some(Err(error)) => tracing::error!(
                task_ids = ?give_back.iter().map(|(id, _)| id).collect::<Vec<_>>(),
                %error,
                "could not give back the rest of a run; stuck-task recovery will return it"
            ),
        }
        for (id, token) in &give_back {
            shared.holdings.done(*id, token);
        }
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, Outage> {
        self.outage.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Successes without a result go through the fast path.
fn fast_path(f: &Finish) -> bool {
    f.state == NextState::Completed && f.result.is_none()
}

/// Counter of committed outcomes, by task type and outcome.
pub(crate) const TASKS_PROCESSED: &str = "outbox_tasks_processed_total";

/// Settles the batch in the worker's holdings, counts committed outcomes
/// and tells subscribers, only now that TX2 has committed.
fn publish(
    shared: &Shared,
    events: &broadcast::Sender<TaskEvent>,
    batch: &[Done],
    written: &Written,
) {
    let ids: HashSet<i64> = written.ids.iter().copied().collect();
    let rejected: HashSet<i64> = written.rejected.iter().copied().collect();
    let unwritten: HashSet<i64> = written.unwritten.iter().copied().collect();
    let cancelled: HashSet<i64> = written.cancelled.iter().copied().collect();
    let subscribed = events.receiver_count() > 0;
    for d in batch {
        let id = d.finish.id;
        if unwritten.contains(&id) {
            // Still held: released at exit, or recovered after the timeout.
            continue;
        }
        shared.holdings.done(id, &d.finish.token);
        if d.finish.delay_us > 0
            && ids.contains(&id)
            && !cancelled.contains(&id)
            && let Some(waker) = shared.wakers.get(&*d.queue)
        {
            // Written just now, so due no earlier than this.
            let delay = Duration::from_micros(u64::try_from(d.finish.delay_us).unwrap_or(0));
            waker.due_at(tokio::time::Instant::now() + delay);
        }
        let kind = if cancelled.contains(&id) {
            // Dead, whatever the handler said: the worker had not heard of
            // the cancel, the database had.
            TaskEventKind::Dead
        } else if ids.contains(&id) {
            d.kind
        } else if rejected.contains(&id) {
            TaskEventKind::Failed
        } else if d.completed_in {
            // Completed by the handler's own transaction, which committed.
            TaskEventKind::Completed
        } else {
            TaskEventKind::Stale
        };
        metrics::counter!(TASKS_PROCESSED, "task_type" => Arc::clone(&d.task_type), "outcome" => kind.as_str())
            .increment(1);
        if subscribed {
            let _ = events.send(TaskEvent {
                id: TaskId(id),
                task_type: d.task_type.to_string(),
                kind,
            });
        }
    }
    shared.throughput.record(
        shared.config.clock.now().unwrap_or_else(chrono::Utc::now),
        batch.iter().filter_map(|d| {
            let id = d.finish.id;
            if rejected.contains(&id) || cancelled.contains(&id) {
                Some((&d.queue, false))
            } else if !ids.contains(&id) && d.completed_in {
                Some((&d.queue, true))
            } else if ids.contains(&id) {
                match d.kind {
                    TaskEventKind::Completed => Some((&d.queue, true)),
                    TaskEventKind::Failed | TaskEventKind::Dead => Some((&d.queue, false)),
                    _ => None,
                }
            } else {
                None
            }
        }),
    );
    for queue in &written.wake {
        if let Some(waker) = shared.wakers.get(&**queue) {
            waker.notify_one();
        }
    }
    if !written.unwritten.is_empty() {
        tracing::error!(
            task_ids = ?written.unwritten,
            "outcomes not written before the flush deadline; these tasks run again (released at exit, or recovered after the heartbeat timeout)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::lane_of;

    #[test]
    fn a_workflows_outcomes_share_a_lane_and_plain_ones_spread() {
        for lanes in 1..=4 {
            let of_one: Vec<usize> = (100..120).map(|id| lane_of(Some(7), id, lanes)).collect();
            assert!(
                of_one.iter().all(|&l| l == of_one[0]),
                "{lanes} lanes: {of_one:?}"
            );
            let plain: Vec<usize> = (100..100 + lanes as i64)
                .map(|id| lane_of(None, id, lanes))
                .collect();
            let mut sorted = plain.clone();
            sorted.sort_unstable();
            assert_eq!(
                sorted,
                (0..lanes).collect::<Vec<_>>(),
                "{lanes} lanes: {plain:?}"
            );
        }
        // Any id (and no lanes at all) gives a lane that exists.
        for id in [i64::MIN, -1, 0, i64::MAX] {
            assert!(lane_of(Some(id), id, 3) < 3);
            assert_eq!(lane_of(None, id, 0), 0);
        }
    }
}
