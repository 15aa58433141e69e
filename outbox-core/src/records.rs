//! What the operator queries return: plain records shared by the library
//! ([`crate::admin`]), the queries behind it (`db::admin`) and every face
//! on them (CLI, metrics, dashboard). Its own module so the arrows run one
//! way: `admin` -> `db::admin` -> `records`.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// A signal sent to a task ([`crate::signal`]), as [`crate::admin::task_signals`]
/// lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SignalRecord {
    /// Its name (what `ctx.wait_for` names).
    pub name: String,
    /// The value sent.
    pub value: serde_json::Value,
    /// When the transaction that sent it wrote it.
    pub sent_at: DateTime<Utc>,
}

/// Everything stored about one task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskRecord {
    /// The task id.
    pub id: i64,
    /// Its task type.
    pub task_type: String,
    /// Its queue.
    pub queue: String,
    /// pending, processing, completed, failed or dead.
    pub state: String,
    /// 0 (first) to 9 (last).
    pub priority: i16,
    /// Failed attempts so far.
    pub retry_count: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Times claimed (attempts started, including released ones).
    pub claims: i32,
    /// When it is (or was) next claimable.
    pub execute_at: DateTime<Utc>,
    /// When it was submitted.
    pub created_at: DateTime<Utc>,
    /// When its row last changed state.
    pub updated_at: DateTime<Utc>,
    /// When it reached COMPLETED or FAILED.
    pub finished_at: Option<DateTime<Utc>>,
    /// When it died.
    pub dead_at: Option<DateTime<Utc>>,
    /// The worker running it.
    pub claimed_by: Option<String>,
    /// Its worker's last heartbeat.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// Its unique key (`task_type:key`, with `:period` for a per-period
    /// uniqueness), if it is unique.
    pub unique_key: Option<String>,
    /// Its ordering key, if it has one.
    pub ordering_key: Option<String>,
    /// Its place among its key's tasks (commit order), if it has a key.
    pub key_seq: Option<i64>,
    /// Waiting for earlier tasks of its ordering key.
    pub blocked: bool,
    /// Dead, whether it let its ordering key go on (its type's
    /// `on_dead = "skip"`, or an operator's cancel), so that later tasks of
    /// the key ran past it, rather than hold the key until an operator acts.
    pub skip_dead: bool,
    /// When its latest attempt started.
    pub attempted_at: Option<DateTime<Utc>>,
    /// What its handler returned ([`crate::Outcome::success_with`]).
    pub result: Option<serde_json::Value>,
    /// The payload.
    pub payload: serde_json::Value,
}

/// A count of tasks of one type in one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TypeStateCount {
    /// The task type.
    pub task_type: String,
    /// The state (as in [`crate::admin::STATES`]).
    pub state: String,
    /// How many.
    pub count: i64,
}

/// The queue's health in a few numbers, cheap enough to poll for gauges.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueHealth {
    /// Tasks due and waiting for a worker.
    pub claimable: i64,
    /// Tasks waiting for a future execute_at (delayed or backing off).
    pub scheduled: i64,
    /// Tasks waiting for earlier tasks of their ordering key.
    pub blocked: i64,
    /// Tasks being run.
    pub processing: i64,
    /// Dead tasks waiting for an operator.
    pub dead: i64,
    /// How long the oldest claimable task has been due, in seconds (0 when
    /// none is).
    pub oldest_claimable_age_s: f64,
    /// Age of the stalest heartbeat among running tasks, in seconds (0 when
    /// none runs). Far above the heartbeat interval means a lost worker
    /// whose tasks recovery has not reclaimed yet.
    pub oldest_heartbeat_age_s: f64,
    /// The task table's health: dead row versions and the oldest open
    /// snapshot.
    #[serde(flatten)]
    pub table: TableHealth,
}

/// What keeps the task table lean or lets it bloat.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TableHealth {
    /// Dead row versions in the task table not yet vacuumed (the
    /// statistics collector's estimate). Claims step over them: a count
    /// that keeps growing means vacuum cannot keep up, or is held back by
    /// an old snapshot.
    pub dead_tuples: i64,
    /// Live rows in the task table (estimate), for scale.
    pub live_tuples: i64,
    /// How long the oldest snapshot held by a session of this database has
    /// been open, in seconds (0 when none is). While it stays open, vacuum
    /// cannot remove row versions that died after it began. Sessions of
    /// other roles are seen only with `pg_read_all_stats`.
    pub oldest_snapshot_age_s: f64,
    /// Which session holds it: pid, application or user, state, and the
    /// start of its query.
    pub oldest_snapshot_holder: Option<String>,
}

/// One queue on the operator overview.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueOverview {
    /// The queue.
    pub queue: String,
    /// Tasks due now and waiting for a worker (new or retrying).
    pub available: i64,
    /// Tasks submitted for later, or snoozed.
    pub scheduled: i64,
    /// Tasks waiting out a failed attempt's backoff.
    pub retrying: i64,
    /// Tasks waiting for earlier tasks of their ordering key.
    pub blocked: i64,
    /// Tasks being run.
    pub processing: i64,
    /// Dead tasks waiting for an operator.
    pub dead: i64,
    /// Tasks completed in the last hour (as workers counted them).
    pub completed_last_hour: i64,
    /// Failed attempts in the last hour, deaths included.
    pub failed_last_hour: i64,
    /// How long the oldest available task has been due, in seconds.
    pub oldest_available_age_s: f64,
}

/// Outcomes of one minute on one queue, summed over every worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MinuteThroughput {
    /// The start of the minute.
    pub minute: DateTime<Utc>,
    /// The queue.
    pub queue: String,
    /// Tasks completed.
    pub completed: i64,
    /// Failed attempts, deaths included.
    pub failed: i64,
}

/// The operator overview: every queue, the last hour minute by minute, and
/// the size of the completed history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Overview {
    /// Every queue with a live, dead or recently finished task, by name.
    pub queues: Vec<QueueOverview>,
    /// The last hour's outcomes per minute and queue, oldest first
    /// (minutes without outcomes are absent).
    pub last_hour: Vec<MinuteThroughput>,
    /// Completed tasks kept, estimated from the planner's statistics.
    pub completed_estimate: i64,
}

/// Which tasks [`crate::admin::search_tasks`] returns; every filter is
/// optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// A state of [`crate::admin::STATES`].
    pub state: Option<String>,
    /// An exact task type.
    pub task_type: Option<String>,
    /// An exact queue.
    pub queue: Option<String>,
    /// One task id.
    pub id: Option<i64>,
    /// Text to find (case-insensitively) in the payload or the last error.
    pub text: Option<String>,
    /// Only tasks with a smaller id: the `next_before` of the previous page.
    pub before: Option<i64>,
    /// Page size (1 to 500; default 50).
    pub limit: Option<i64>,
    /// Leave payloads and results out (JSON null), for lists that do not
    /// show them: a payload can be megabytes.
    pub without_payload: bool,
}

/// One page of tasks, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskPage {
    /// The tasks.
    pub tasks: Vec<TaskRecord>,
    /// Where the next page starts (its `before`), if there may be one.
    pub next_before: Option<i64>,
}

/// A queue's settings, applying to every worker of the cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueSettings {
    /// The queue.
    pub name: String,
    /// Since when it is paused (no new claims anywhere), if it is.
    pub paused_at: Option<DateTime<Utc>>,
    /// At most this many of its tasks run at once, cluster-wide.
    pub global_concurrency: Option<i32>,
    /// At most this many attempts start per second, cluster-wide.
    pub rate_per_second: Option<f64>,
    /// Tasks of one ordering key that run at once (1 by default).
    pub per_key_concurrency: i32,
    /// When the settings last changed.
    pub updated_at: DateTime<Utc>,
}

impl QueueSettings {
    /// True when claims must count against a global limit or a rate.
    pub fn is_limited(&self) -> bool {
        self.global_concurrency.is_some() || self.rate_per_second.is_some()
    }
}

/// A worker as it reported itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerRecord {
    /// Its run id (unique per process run).
    pub id: String,
    /// The machine it runs on.
    pub host: String,
    /// Its process id there.
    pub pid: i32,
    /// The queues it serves, with their concurrency.
    pub queues: Vec<WorkerQueue>,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When it last reported.
    pub last_seen_at: DateTime<Utc>,
    /// It counts as alive until then unless it reports again.
    pub expires_at: DateTime<Utc>,
    /// Whether it is alive now (by the database clock).
    pub alive: bool,
    /// Whether it leads maintenance now (recovery, cleanup, and the only
    /// one that enqueues periodic ticks).
    pub leader: bool,
}

/// One queue a worker serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct WorkerQueue {
    /// The queue.
    pub queue: String,
    /// The worker's concurrency on it.
    pub concurrency: u32,
}

/// What [`crate::admin::delete_queue`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueDeletion {
    /// The queue's settings row is gone.
    Deleted,
    /// The queue has no settings row.
    NotFound,
    /// Refused: this many live workers serve the queue (each would add its
    /// row back, without the settings, within a second).
    Served(i64),
    /// Refused: tasks wait or run on the queue.
    Unfinished,
}

/// A change of a queue's settings; `None` keeps the current value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueChange {
    /// `Some(true)` pauses, `Some(false)` resumes.
    pub paused: Option<bool>,
    /// `Some(None)` removes the global limit.
    pub global_concurrency: Option<Option<i32>>,
    /// Per second; `Some(None)` removes the rate limit.
    pub rate_per_second: Option<Option<f64>>,
    /// Tasks of one ordering key that run at once.
    pub per_key_concurrency: Option<i32>,
}

/// Chained setters, so a change reads as what it does:
/// `QueueChange::new().global_concurrency(5).rate_per_second(50.0)`.
/// Whatever is not set keeps its current value.
impl QueueChange {
    /// No change yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Pause the queue: no new claims anywhere; running tasks finish.
    pub fn pause(mut self) -> Self {
        self.paused = Some(true);
        self
    }

    /// Resume a paused queue.
    pub fn resume(mut self) -> Self {
        self.paused = Some(false);
        self
    }

    /// At most `limit` tasks of the queue running at once, cluster-wide
    /// (1 to [`crate::admin::MAX_QUEUE_LIMIT`]).
    pub fn global_concurrency(mut self, limit: i32) -> Self {
        self.global_concurrency = Some(Some(limit));
        self
    }

    /// Remove the global concurrency limit.
    pub fn no_global_concurrency(mut self) -> Self {
        self.global_concurrency = Some(None);
        self
    }

    /// At most `rate` attempts started per second, cluster-wide (more than
    /// 0, at most [`crate::admin::MAX_RATE_PER_SECOND`]).
    pub fn rate_per_second(mut self, rate: f64) -> Self {
        self.rate_per_second = Some(Some(rate));
        self
    }

    /// Remove the rate limit.
    pub fn no_rate_limit(mut self) -> Self {
        self.rate_per_second = Some(None);
        self
    }

    /// Up to `n` tasks of one ordering key running at once (1 to
    /// [`crate::admin::MAX_QUEUE_LIMIT`]).
    pub fn per_key_concurrency(mut self, n: i32) -> Self {
        self.per_key_concurrency = Some(n);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::QueueChange;

    #[test]
    fn queue_change_setters_fill_the_fields_they_name_and_keep_the_rest() {
        let change = QueueChange::new()
            .pause()
            .global_concurrency(5)
            .no_rate_limit()
            .per_key_concurrency(2);
        assert_eq!(
            change,
            QueueChange {
                paused: Some(true),
                global_concurrency: Some(Some(5)),
                rate_per_second: Some(None),
                per_key_concurrency: Some(2),
            }
        );
        let change = QueueChange::new()
            .resume()
            .no_global_concurrency()
            .rate_per_second(50.0);
        assert_eq!(
            change,
            QueueChange {
                paused: Some(false),
                global_concurrency: Some(None),
                rate_per_second: Some(Some(50.0)),
                per_key_concurrency: None,
            }
        );
        assert_eq!(QueueChange::new(), QueueChange::default());
    }
}
