//! What the operator queries return: plain records shared by the library
//! ([`crate::admin`]), the queries behind it (`db::admin`) and every face
//! on them (CLI, metrics, dashboard). Its own module so the arrows run one
//! way: `admin` -> `db::admin` -> `records`.

use chrono::{DateTime, Utc};
use serde::Serialize;

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
}
