//! `tasks explain`: why a task is not running now, in the terms an
//! operator acts on (a time to wait for, the task its key waits behind, a
//! paused or limited queue, no worker serving its queue, dead and why).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Row};

use crate::db;
use crate::error::Result;
use crate::records::TaskRecord;
use crate::task::TaskId;

/// Why a task is where it is. A task that waits may have several reasons
/// at once (a paused queue and no worker, say); all of them are listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// It finished successfully.
    Completed {
        /// When.
        finished_at: Option<DateTime<Utc>>,
    },
    /// It is dead: no attempts left, given up, or cancelled.
    Dead {
        /// The last error.
        error: Option<String>,
        /// When it died.
        dead_at: Option<DateTime<Utc>>,
        /// With an ordering key that it still holds: the tasks waiting
        /// behind it until an operator retries, cancels or skips it.
        blocking: Option<i64>,
    },
    /// A worker is running it now (or, in a run of its key's tasks, after
    /// the ones before it).
    #[non_exhaustive]
    Running {
        /// The claim holder.
        worker: Option<String>,
        /// When this attempt started (none for a task of a run that has not
        /// ended yet: its start is recorded with its outcome).
        since: Option<DateTime<Utc>>,
        /// Whether the claiming worker still reports in (false: it is gone,
        /// and stuck-task recovery puts the task back once its heartbeat is
        /// a heartbeat timeout old).
        worker_alive: bool,
        /// The task's last heartbeat.
        heartbeat_at: Option<DateTime<Utc>>,
        /// Claimed in a run of its key's tasks, behind the run's head.
        in_run: bool,
    },
    /// Submitted to run later.
    Scheduled {
        /// When it becomes due.
        at: DateTime<Utc>,
    },
    /// An attempt failed (or snoozed); it waits for the next one.
    WaitingForRetry {
        /// When the next attempt is due.
        at: DateTime<Utc>,
        /// Failed attempts so far.
        failed_attempts: i32,
        /// The last error.
        error: Option<String>,
    },
    /// Its handler suspended it (a sleep, a snooze, or a wait for a
    /// signal) with no attempt failed: it runs again then, or when a
    /// signal is sent to it.
    Suspended {
        /// When it runs again unless a signal wakes it first.
        until: DateTime<Utc>,
    },
    /// Earlier tasks of its ordering key have to finish first.
    BehindKey {
        /// The ordering key.
        key: String,
        /// The task holding the key now.
        holder: Option<i64>,
        /// That task's state (dead: an operator must act).
        holder_state: Option<String>,
    },
    /// Its queue is paused.
    QueuePaused {
        /// Since when.
        since: DateTime<Utc>,
    },
    /// Its queue runs as many tasks as its global concurrency allows.
    AtGlobalLimit {
        /// Tasks of the queue running now.
        running: i64,
        /// The limit.
        limit: i32,
    },
    /// Its queue starts attempts at a limited rate.
    RateLimited {
        /// Attempts per second.
        per_second: f64,
    },
    /// No live worker serves its queue.
    NoLiveWorker {
        /// The queue.
        queue: String,
    },
    /// It is due; the next free worker takes it.
    Due {
        /// Due tasks of its queue that go before it (counted up to 10,000).
        ahead: i64,
    },
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Completed { finished_at } => match finished_at {
                Some(at) => write!(f, "completed at {at}"),
                None => write!(f, "completed"),
            },
            Reason::Dead {
                error, blocking, ..
            } => {
                write!(
                    f,
                    "dead: {}",
                    error.as_deref().unwrap_or("no error recorded")
                )?;
                if let Some(n) = blocking {
                    write!(
                        f,
                        "; it holds its ordering key, {n} task(s) wait behind it \
                         (retry it, or cancel it to skip it)"
                    )?;
                }
                Ok(())
            }
            Reason::Running {
                worker,
                since,
                worker_alive,
                heartbeat_at,
                in_run,
            } => {
                let worker = worker.as_deref().unwrap_or("an unknown worker");
                match since {
                    Some(t) => write!(f, "running on {worker} since {t}")?,
                    None if *in_run => write!(
                        f,
                        "claimed by {worker} in a run of its ordering key's tasks: it runs \
                         after those before it in the run, or runs now"
                    )?,
                    None => write!(f, "running on {worker}")?,
                }
                if !worker_alive {
                    write!(
                        f,
                        "; but that worker is gone (last heartbeat {}): stuck-task recovery \
                         puts it back once its heartbeat is a heartbeat timeout old",
                        heartbeat_at.map_or_else(|| "never".to_owned(), crate::admin::show_time)
                    )?;
                }
                Ok(())
            }
            Reason::Scheduled { at } => write!(
                f,
                "scheduled for {} (an operator's retry makes it due now)",
                crate::admin::show_time(*at)
            ),
            Reason::WaitingForRetry {
                at,
                failed_attempts,
                error,
            } => write!(
                f,
                "waiting for its next attempt at {} after {failed_attempts} failed attempt(s); last error: {}",
                crate::admin::show_time(*at),
                error.as_deref().unwrap_or("none")
            ),
            Reason::Suspended { until } => write!(
                f,
                "suspended until {}: its handler slept, snoozed or waits for a signal \
                 (ctx.sleep, Outcome::RetryAfter, ctx.wait_for); a signal sent to it wakes it at once",
                crate::admin::show_time(*until)
            ),
            Reason::BehindKey {
                key,
                holder,
                holder_state,
            } => match holder {
                Some(id) => write!(
                    f,
                    "behind task {id} ({}) of its ordering key {key:?}",
                    holder_state.as_deref().unwrap_or("unknown state")
                ),
                None => write!(
                    f,
                    "waiting for its ordering key {key:?} (the hand-over is due; maintenance completes it)"
                ),
            },
            Reason::QueuePaused { since } => {
                write!(
                    f,
                    "its queue is paused (since {})",
                    crate::admin::show_time(*since)
                )
            }
            Reason::AtGlobalLimit { running, limit } => write!(
                f,
                "its queue is at its global concurrency: {running} running, limit {limit}"
            ),
            Reason::RateLimited { per_second } => {
                write!(
                    f,
                    "its queue is rate limited to {}",
                    crate::admin::show_rate(*per_second)
                )
            }
            Reason::NoLiveWorker { queue } => {
                write!(f, "no live worker serves its queue {queue:?}")
            }
            Reason::Due { ahead } => {
                if *ahead == 0 {
                    write!(
                        f,
                        "due now and first in its queue: the next free worker takes it"
                    )
                } else {
                    write!(f, "due now, {ahead} due task(s) go before it in its queue")
                }
            }
        }
    }
}

/// A task with the reasons it is where it is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// The task.
    pub task: TaskRecord,
    /// Why it is not running now (or that it is, or finished).
    pub reasons: Vec<Reason>,
    /// The workflow whose step the task is, and the step's name; known
    /// while the task has not completed.
    pub workflow: Option<(i64, String)>,
}

/// Explains task `id`; `None` when there is no such task.
pub async fn explain_task(pool: &PgPool, id: TaskId) -> Result<Option<Explanation>> {
    let Some(task) = db::admin::get_task(pool, id.0).await? else {
        return Ok(None);
    };
    let ctx = crate::pooler::on(pool, async |conn| {
        sqlx::query(include_str!("db/sql/explain_task.sql"))
            .bind(id.0)
            .fetch_optional(conn)
            .await
    })
    .await?;
    let Some(ctx) = ctx else {
        // Deleted between the two reads: explain what was seen.
        return Ok(Some(Explanation {
            reasons: Vec::new(),
            task,
            workflow: None,
        }));
    };
    let workflow = ctx
        .try_get::<Option<i64>, _>("workflow_id")?
        .zip(ctx.try_get::<Option<String>, _>("workflow_step")?);
    let mut reasons = Vec::new();
    match task.state.as_str() {
        "completed" => reasons.push(Reason::Completed {
            finished_at: task.finished_at,
        }),
        "dead" => {
            let waiting: i64 = ctx.try_get("key_waiting")?;
            let skipped: bool = ctx.try_get("skip_dead")?;
            let holds_key = task.ordering_key.is_some() && waiting > 0 && !skipped;
            reasons.push(Reason::Dead {
                error: task.last_error.clone(),
                dead_at: task.dead_at,
                blocking: holds_key.then_some(waiting),
            });
        }
        "processing" => reasons.push(Reason::Running {
            worker: task.claimed_by.clone(),
            since: task.attempted_at,
            worker_alive: ctx
                .try_get::<Option<bool>, _>("claimer_alive")?
                .unwrap_or(false),
            heartbeat_at: task.heartbeat_at,
            in_run: task.blocked,
        }),
        _ => waiting_reasons(pool, &task, &ctx, &mut reasons).await?,
    }
    Ok(Some(Explanation {
        task,
        reasons,
        workflow,
    }))
}

async fn waiting_reasons(
    pool: &PgPool,
    task: &TaskRecord,
    ctx: &sqlx::postgres::PgRow,
    reasons: &mut Vec<Reason>,
) -> Result<()> {
    let now: DateTime<Utc> = ctx.try_get("now")?;
    if task.blocked {
        let holder: Option<i64> = ctx.try_get("key_holder")?;
        let holder_state = match holder {
            Some(h) => db::admin::get_task(pool, h).await?.map(|t| t.state),
            None => None,
        };
        reasons.push(Reason::BehindKey {
            key: task.ordering_key.clone().unwrap_or_default(),
            holder,
            holder_state,
        });
    }
    if task.execute_at > now {
        if task.state == "pending"
            && task.claims > 0
            && task.retry_count == 0
            && task.last_error.is_none()
        {
            reasons.push(Reason::Suspended {
                until: task.execute_at,
            });
        } else if task.claims > 0 || task.state == "failed" {
            reasons.push(Reason::WaitingForRetry {
                at: task.execute_at,
                failed_attempts: task.retry_count,
                error: task.last_error.clone(),
            });
        } else {
            reasons.push(Reason::Scheduled {
                at: task.execute_at,
            });
        }
    }
    if let Some(since) = ctx.try_get::<Option<DateTime<Utc>>, _>("paused_at")? {
        reasons.push(Reason::QueuePaused { since });
    }
    if let Some(limit) = ctx.try_get::<Option<i32>, _>("global_concurrency")? {
        let running: i64 = ctx.try_get("running")?;
        if running >= i64::from(limit) {
            reasons.push(Reason::AtGlobalLimit { running, limit });
        }
    }
    if let Some(per_second) = ctx.try_get::<Option<f64>, _>("rate_per_second")? {
        reasons.push(Reason::RateLimited { per_second });
    }
    if ctx.try_get::<i64, _>("live_workers")? == 0 {
        reasons.push(Reason::NoLiveWorker {
            queue: task.queue.clone(),
        });
    }
    if reasons.is_empty() {
        reasons.push(Reason::Due {
            ahead: ctx.try_get("ahead")?,
        });
    }
    Ok(())
}
