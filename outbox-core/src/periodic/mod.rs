//! Periodic tasks: declared on the worker (in code, or `run --periodic` on
//! the CLI), enqueued by the maintenance leader once per tick across the
//! whole cluster.
//!
//! Each maintenance round the leader enqueues, once each, every tick from
//! now to a horizon ahead (due at its time, so a worker claims it then,
//! woken by the leader's NOTIFY at the tick), and the latest tick at or
//! before now if it was not enqueued: after downtime, only the latest
//! missed tick runs (once), unless the task says [`MissedTicks::Skip`].
//! The horizon outlasts a leader's lease and its successor's first round,
//! so a killed leader loses no tick either.

mod schedule;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool, Row};

pub use schedule::Schedule;

use crate::error::{Error, Result};
use crate::options::{validate_priority, validate_queue};
use crate::retry::max_attempts;
use crate::task::{RegisteredTask, Task};

/// What to do with ticks missed while no leader ran (all workers down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissedTicks {
    /// Run the latest missed tick once (the default).
    #[default]
    RunLatest,
    /// Run none: wait for the next tick.
    Skip,
}

/// A periodic task as declared on a worker.
#[derive(Debug, Clone)]
pub struct PeriodicTask {
    pub(crate) name: String,
    pub(crate) schedule: Schedule,
    pub(crate) task_type: String,
    pub(crate) queue: String,
    pub(crate) priority: i16,
    pub(crate) max_attempts: i32,
    pub(crate) payload: String,
    /// The task's ordering key, from its payload as for a submit: a tick
    /// waits its turn behind the key's other tasks.
    pub(crate) ordering_key: Option<String>,
    /// The type's `on_dead = "skip"`.
    pub(crate) skip_dead: bool,
    pub(crate) missed: MissedTicks,
}

impl PeriodicTask {
    /// `task` every tick of `schedule` (`every 30s`, `0 3 * * *`,
    /// `*/10 * * * * *` with seconds, `CRON_TZ=Europe/Paris 0 3 * * *`),
    /// under `name`, unique in the cluster.
    pub fn new<T: Task>(name: impl Into<String>, schedule: &str, task: &T) -> Result<Self> {
        let payload = serde_json::to_string(task).map_err(|source| Error::Serialize {
            task_type: T::TASK_TYPE.to_owned(),
            source,
        })?;
        Self::build(
            name.into(),
            schedule,
            T::TASK_TYPE,
            T::QUEUE,
            T::PRIORITY,
            T::RETRY_DELAYS,
            payload,
        )
        .map(|p| p.keyed(task.ordering_key(), T::DEAD_SKIPS_KEY))
    }

    /// A periodic task of a registered type with a JSON payload (what `run
    /// --periodic` declares). The payload is checked against the type.
    pub fn from_json(
        name: impl Into<String>,
        schedule: &str,
        task: &RegisteredTask,
        payload: &str,
    ) -> Result<Self> {
        (task.check_payload)(payload).map_err(|reason| Error::InvalidPayload {
            task_type: task.task_type.to_owned(),
            reason,
        })?;
        let ordering_key = (task.ordering_of)(payload).map_err(|reason| Error::InvalidPayload {
            task_type: task.task_type.to_owned(),
            reason: format!("its ordering key cannot be read: {reason}"),
        })?;
        Self::build(
            name.into(),
            schedule,
            task.task_type,
            task.queue,
            task.priority,
            task.retry_delays,
            payload.to_owned(),
        )
        .map(|p| p.keyed(ordering_key, task.dead_skips_key))
    }

    /// With the ordering key and `on_dead` its task type gives a submit.
    fn keyed(mut self, ordering_key: Option<String>, skip_dead: bool) -> Self {
        self.ordering_key = ordering_key;
        self.skip_dead = skip_dead;
        self
    }

    fn build(
        name: String,
        schedule: &str,
        task_type: &str,
        queue: &str,
        priority: i16,
        retry_delays: &[std::time::Duration],
        payload: String,
    ) -> Result<Self> {
        let ok_name = !name.is_empty()
            && name.len() <= 128
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
        if !ok_name {
            return Err(Error::InvalidOption(format!(
                "periodic task name {name:?} is invalid: use 1 to 128 ASCII letters, digits or _-.:"
            )));
        }
        let schedule: Schedule = schedule
            .parse()
            .map_err(|e| Error::InvalidOption(format!("periodic task {name:?}: {e}")))?;
        validate_queue(queue)?;
        validate_priority(priority)?;
        if crate::submit::contains_nul_escape(&payload) {
            return Err(Error::InvalidPayload {
                task_type: task_type.to_owned(),
                reason: "it contains U+0000, which PostgreSQL's jsonb cannot hold".to_owned(),
            });
        }
        Ok(Self {
            name,
            schedule,
            task_type: task_type.to_owned(),
            queue: queue.to_owned(),
            priority,
            max_attempts: max_attempts(retry_delays),
            payload,
            ordering_key: None,
            skip_dead: false,
            missed: MissedTicks::default(),
        })
    }

    /// What to do with ticks missed while no worker ran.
    pub fn missed_ticks(mut self, missed: MissedTicks) -> Self {
        self.missed = missed;
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }
}

/// A periodic task as the cluster has recorded it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeriodicRecord {
    /// Its name.
    pub name: String,
    /// Its schedule, as written.
    pub schedule: String,
    /// The task type it enqueues.
    pub task_type: String,
    /// The queue.
    pub queue: String,
    /// The payload.
    pub payload: serde_json::Value,
    /// The latest tick covered: enqueued (often ahead of its time), or,
    /// for a task declared after it, the point its schedule started from
    /// (nothing was enqueued for it).
    pub last_run: Option<DateTime<Utc>>,
    /// The next tick.
    pub next_run: Option<DateTime<Utc>>,
    /// When a leader last recorded its declaration.
    pub declared_at: DateTime<Utc>,
    /// Its next tick is over a minute past (on the database's clock): the
    /// leader enqueues ticks ahead, so no leader enqueues this task (none
    /// runs, or the leader does not declare it).
    pub overdue: bool,
}

/// Every periodic task recorded in the database, by name.
pub async fn list(pool: &PgPool) -> Result<Vec<PeriodicRecord>> {
    let rows = crate::pooler::on(pool, async |conn| {
        sqlx::query(include_str!("../db/sql/list_periodic.sql"))
            .fetch_all(conn)
            .await
    })
    .await?;
    rows.iter()
        .map(|r| {
            let payload: String = r.try_get("payload")?;
            Ok(PeriodicRecord {
                name: r.try_get("name")?,
                schedule: r.try_get("schedule")?,
                task_type: r.try_get("task_type")?,
                queue: r.try_get("queue")?,
                payload: serde_json::from_str(&payload)
                    .unwrap_or(serde_json::Value::String(payload)),
                last_run: r.try_get("last_tick")?,
                next_run: r.try_get("next_tick")?,
                declared_at: r.try_get("updated_at")?,
                overdue: r.try_get("overdue")?,
            })
        })
        .collect::<sqlx::Result<_>>()
        .map_err(Error::from)
}

/// What [`delete`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeriodicDeletion {
    /// The record is gone, and this many ticks it had enqueued ahead, none
    /// started, with it.
    Deleted {
        /// Ticks taken back.
        ticks: i64,
    },
    /// No periodic task has that name.
    NotFound,
    /// Refused: the current maintenance leader declares it (its code or
    /// `run --periodic` does), so it would stop ticking only until the next
    /// leader records it again.
    Declared,
}

/// Deletes a periodic task's record (one removed from the code, which
/// `list` would show for ever) and the ticks it enqueued ahead and never
/// started. Refused while the current leader declares it, unless `force`:
/// then its ticks stop until a leader records it again (the next change of
/// leader, if the code still declares it).
pub async fn delete(pool: &PgPool, name: &str, force: bool) -> Result<PeriodicDeletion> {
    let mut tx = crate::pooler::begin(pool).await?;
    sqlx::query(include_str!("../db/sql/lock_periodic.sql"))
        .bind(name)
        .execute(&mut *tx)
        .await?;
    let row = sqlx::query(include_str!("../db/sql/delete_periodic.sql"))
        .bind(name)
        .bind(force)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    let found: bool = row.try_get("found")?;
    let deleted: bool = row.try_get("deleted")?;
    Ok(if !found {
        PeriodicDeletion::NotFound
    } else if deleted {
        PeriodicDeletion::Deleted {
            ticks: row.try_get("dropped")?,
        }
    } else {
        PeriodicDeletion::Declared
    })
}

/// Records the declarations (the leader, once per leadership).
pub(crate) async fn declare(
    conn: &mut PgConnection,
    tasks: &[PeriodicTask],
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    for t in tasks {
        sqlx::query(include_str!("../db/sql/declare_periodic.sql"))
            .bind(&t.name)
            .bind(t.schedule.as_str())
            .bind(&t.task_type)
            .bind(&t.queue)
            .bind(&t.payload)
            .bind(t.schedule.latest_at_or_before(now))
            .bind(t.schedule.next_after(now))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The names among `tasks` that the current maintenance leader does not
/// declare as they are declared here (periodic_undeclared.sql): they run
/// only while a worker declaring them leads. None while no one leads or
/// the leadership is younger than `settle`: ask again later.
pub(crate) async fn undeclared(
    conn: &mut PgConnection,
    tasks: &[PeriodicTask],
    settle: std::time::Duration,
) -> sqlx::Result<Option<Vec<String>>> {
    let column = |f: fn(&PeriodicTask) -> &str| -> Vec<&str> { tasks.iter().map(f).collect() };
    let row: Option<(bool, Vec<String>)> =
        sqlx::query_as(include_str!("../db/sql/periodic_undeclared.sql"))
            .bind(column(|t| &t.name))
            .bind(column(|t| t.schedule.as_str()))
            .bind(column(|t| &t.task_type))
            .bind(column(|t| &t.queue))
            .bind(column(|t| &t.payload))
            .bind(crate::options::delay_micros(settle).unwrap_or(i64::MAX))
            .fetch_optional(conn)
            .await?;
    Ok(row.and_then(|(settled, names)| settled.then_some(names)))
}

/// The most ticks of one task enqueued ahead in one round.
const MAX_AHEAD: usize = 1000;

/// How far ahead the leader enqueues ticks: past its lease's expiry and the
/// next leader's first round (maintenance rounds `round` apart), so the
/// ticks go on through a change of leader.
pub(crate) fn horizon(round: std::time::Duration) -> chrono::TimeDelta {
    let ahead = crate::worker::lease_ttl(round) + round * 2;
    chrono::TimeDelta::from_std(ahead).unwrap_or(chrono::TimeDelta::MAX)
}

/// Each task's ticks after `now` and within the horizon, in order, with the
/// queue they run on: what the leader wakes workers for.
pub(crate) fn upcoming(
    tasks: &[PeriodicTask],
    now: DateTime<Utc>,
    round: std::time::Duration,
) -> Vec<(String, DateTime<Utc>)> {
    let end = now.checked_add_signed(horizon(round)).unwrap_or(now);
    let mut out = Vec::new();
    for t in tasks {
        let mut at = now;
        for _ in 0..MAX_AHEAD {
            match t.schedule.next_after(at) {
                Some(tick) if tick <= end && tick > at => {
                    out.push((t.queue.clone(), tick));
                    at = tick;
                }
                _ => break,
            }
        }
    }
    out
}

/// Enqueues the due tick of each task, if not yet enqueued, then every
/// tick within the horizon; returns how many ticks of each task were
/// enqueued.
pub(crate) async fn enqueue_due(
    conn: &mut PgConnection,
    tasks: &[PeriodicTask],
    now: DateTime<Utc>,
    holder: &str,
    round: std::time::Duration,
) -> sqlx::Result<Vec<(String, usize)>> {
    let mut enqueued = Vec::new();
    for t in tasks {
        // One transaction per task: the tick that moves last_tick and the
        // removal of the ticks missed before it commit together, so that
        // neither a leader that dies between them nor a reader between them
        // sees missed ticks left to run.
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let conn = &mut *tx;
        let mut n = 0;
        // The latest tick so far. A leader that enqueued ahead has it
        // already (last_tick is past it, so this is a no-op); otherwise no
        // leader ran through it (downtime). Skip: one older than a couple
        // of rounds moves last_tick past it without running it.
        if let Some(tick) = t.schedule.latest_at_or_before(now) {
            let stale = chrono::TimeDelta::from_std(round * 2).unwrap_or(chrono::TimeDelta::MAX);
            let run = t.missed == MissedTicks::RunLatest || now - tick <= stale;
            let (moved, was, id): (bool, Option<DateTime<Utc>>, Option<i64>) =
                sqlx::query_as(include_str!("../db/sql/enqueue_periodic.sql"))
                    .bind(&t.name)
                    .bind(tick)
                    .bind(t.schedule.next_after(tick))
                    .bind(&t.task_type)
                    .bind(&t.queue)
                    .bind(&t.payload)
                    .bind(t.max_attempts)
                    .bind(t.priority)
                    .bind(holder)
                    .bind(run)
                    .bind(&t.ordering_key)
                    .bind(t.skip_dead)
                    .fetch_one(&mut *conn)
                    .await?;
            if moved {
                // Ticks enqueued ahead before the downtime and never
                // started were missed: MissedTicks alone decides.
                // Only those: a tick due before the last leader's horizon
                // was enqueued when it came due and waits in the backlog.
                let earliest = was.and_then(|was| was.checked_sub_signed(horizon(round)));
                let dropped: i64 =
                    sqlx::query_scalar(include_str!("../db/sql/drop_missed_periodic.sql"))
                        .bind(&t.name)
                        .bind(tick)
                        .bind(&t.task_type)
                        .bind(&t.queue)
                        .bind(earliest)
                        .fetch_one(&mut *conn)
                        .await?;
                if dropped > 0 {
                    tracing::info!(periodic = %t.name, dropped, "dropped ticks missed while no leader ran");
                }
            }
            n += usize::from(id.is_some());
        }
        // Then every tick to the horizon, in one statement, each due at its
        // time.
        let ahead: Vec<DateTime<Utc>> = upcoming(std::slice::from_ref(t), now, round)
            .into_iter()
            .map(|(_, tick)| tick)
            .collect();
        if let Some(last) = ahead.last() {
            let ids: Vec<i64> =
                sqlx::query_scalar(include_str!("../db/sql/enqueue_periodic_ahead.sql"))
                    .bind(&t.name)
                    .bind(&ahead)
                    .bind(t.schedule.next_after(*last))
                    .bind(&t.task_type)
                    .bind(&t.queue)
                    .bind(&t.payload)
                    .bind(t.max_attempts)
                    .bind(t.priority)
                    .bind(holder)
                    .bind(&t.ordering_key)
                    .bind(t.skip_dead)
                    .fetch_all(&mut *conn)
                    .await?;
            n += ids.len();
        }
        tx.commit().await?;
        if n > 0 {
            enqueued.push((t.name.clone(), n));
        }
    }
    Ok(enqueued)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn every(schedule: &str) -> PeriodicTask {
        PeriodicTask::build(
            "t".into(),
            schedule,
            "t.t",
            "q",
            0,
            crate::retry::DEFAULT_RETRY_DELAYS,
            "{}".into(),
        )
        .unwrap()
    }

    #[test]
    fn upcoming_ticks_reach_past_a_lease_and_the_next_leaders_first_round() {
        let now = DateTime::from_timestamp(1_000_000, 500_000_000).unwrap();
        let ticks = upcoming(&[every("every 1s")], now, Duration::from_secs(5));
        // Lease 10 s plus two rounds: 20 s ahead, strictly after now.
        assert_eq!(ticks.len(), 20);
        assert_eq!(ticks[0].1.timestamp(), 1_000_001);
        assert_eq!(ticks[19].1.timestamp(), 1_000_020);
        assert!(ticks.iter().all(|(q, _)| q == "q"));
        // A fine schedule with a long round stops at the cap.
        let capped = upcoming(&[every("every 1s")], now, Duration::from_secs(3600));
        assert_eq!(capped.len(), MAX_AHEAD);
        // A coarse one may have none within the horizon.
        assert!(upcoming(&[every("every 1d")], now, Duration::from_secs(5)).len() <= 1);
    }
}
