//! Operator tooling: list, inspect, retry and cancel tasks; counts for
//! `stats` and for metrics gauges. The `outbox-worker tasks` and `stats`
//! commands are thin wrappers over these.

use sqlx::PgPool;

use crate::db;
use crate::error::{Error, Result};
use crate::task::TaskId;

pub use crate::explain::{Explanation, Reason, explain_task};
pub use crate::records::{
    MinuteThroughput, Overview, QueueChange, QueueDeletion, QueueHealth, QueueOverview,
    QueueSettings, SignalRecord, TableHealth, TaskFilter, TaskPage, TaskRecord, TypeStateCount,
    WorkerQueue, WorkerRecord,
};

/// The states an operator can filter on. `dead` is FAILED with no attempts
/// left (or given up, or cancelled); `failed` is FAILED and waiting for its
/// next attempt.
pub const STATES: &[&str] = &["pending", "processing", "completed", "failed", "dead"];

/// Lists tasks, newest first, optionally of one state (see [`STATES`]) and
/// one task type.
pub async fn list_tasks(
    pool: &PgPool,
    state: Option<&str>,
    task_type: Option<&str>,
    limit: i64,
) -> Result<Vec<TaskRecord>> {
    let filter = TaskFilter {
        state: state.map(str::to_owned),
        task_type: task_type.map(str::to_owned),
        ..TaskFilter::default()
    };
    list_tasks_where(pool, &filter, limit).await
}

/// Lists at most `limit` tasks, newest first, that match `filter`: its
/// state (see [`STATES`]), type, queue, id, text and `before` (its page
/// size and `without_payload` are not used).
pub async fn list_tasks_where(
    pool: &PgPool,
    filter: &TaskFilter,
    limit: i64,
) -> Result<Vec<TaskRecord>> {
    check_state(filter.state.as_deref())?;
    Ok(db::admin::search_tasks(pool, filter, None, limit.max(0)).await?)
}

/// One task, if it exists.
pub async fn get_task(pool: &PgPool, id: TaskId) -> Result<Option<TaskRecord>> {
    Ok(db::admin::get_task(pool, id.0).await?)
}

/// The signals sent to task `id`, in the order they were sent (the first
/// of each name is kept; a handler's `ctx.wait_for(name)` returns it).
pub async fn task_signals(pool: &PgPool, id: TaskId) -> Result<Vec<SignalRecord>> {
    Ok(db::admin::task_signals(pool, id.0)
        .await?
        .into_iter()
        .map(|(name, value, sent_at)| SignalRecord {
            name,
            value: value.0,
            sent_at,
        })
        .collect())
}

/// Makes these FAILED tasks (dead or waiting to retry) claimable now with a
/// fresh attempt budget, and these PENDING tasks due later (submitted with
/// a delay, snoozed, a periodic tick enqueued ahead) due now with the
/// budget they have; a task behind its ordering key still waits for its
/// turn. COMPLETED tasks run again, as River's `JobRetry` and Oban's
/// `retry_job` allow: due now with a fresh budget, without their result,
/// behind the tasks waiting for their ordering key (a completed task kept
/// for its uniqueness queues first in its key's line). Workers of their
/// queues are notified. Not retried: a forward step of a saga that
/// compensates or compensated, or of a workflow an operator cancelled (its
/// work would come back after the undo); a workflow's completed step (it
/// would run outside its workflow); a unique task whose key a live task
/// holds. Returns the ids that were retried; [`why_not_retried`] says why
/// the others were not.
pub async fn retry_tasks(pool: &PgPool, ids: &[TaskId]) -> Result<Vec<TaskId>> {
    let wanted: Vec<i64> = ids.iter().map(|id| id.0).collect();
    let mut done = db::admin::retry_tasks(pool, Some(wanted.clone()), None).await?;
    // The rest may be in the history: completed, to run again.
    let rest: Vec<i64> = wanted.into_iter().filter(|id| !done.contains(id)).collect();
    if !rest.is_empty() {
        done.extend(db::admin::revive_completed(pool, rest).await?);
    }
    Ok(done.into_iter().map(TaskId).collect())
}

/// Why each of these tasks would not be retried by [`retry_tasks`], read
/// as it is now: `running`, `due already`, `due, waiting for its ordering
/// key`, `its unique key is held by task N`, `a forward step of workflow N,
/// which is compensating` (or cancelled, ...), `a completed step of a
/// workflow: ...`, `no such task`. For the tasks a retry left: what to
/// tell the operator.
pub async fn why_not_retried(pool: &PgPool, ids: &[TaskId]) -> Result<Vec<(TaskId, String)>> {
    let ids = ids.iter().map(|id| id.0).collect();
    Ok(db::admin::retry_refusals(pool, ids)
        .await?
        .into_iter()
        .map(|(id, why)| (TaskId(id), why))
        .collect())
}

/// Makes every dead task (of one type, if given) claimable now with a fresh
/// attempt budget, except the forward steps [`retry_tasks`] refuses;
/// returns their ids.
pub async fn retry_dead(pool: &PgPool, task_type: Option<&str>) -> Result<Vec<TaskId>> {
    Ok(db::admin::retry_tasks(pool, None, task_type)
        .await?
        .into_iter()
        .map(TaskId)
        .collect())
}

/// Cancels tasks: those not running (PENDING, or FAILED and waiting to
/// retry) become dead at once with the error "cancelled by an operator";
/// running ones are marked and the worker holding each is told (NOTIFY on
/// the control channel, with its heartbeat as the fallback), which fires
/// that task's cancellation token; whatever the attempt returns afterwards,
/// the task ends dead with the same error, never retried. Returns the ids
/// cancelled or asked to cancel (finished and dead tasks are left alone).
pub async fn cancel_tasks(pool: &PgPool, ids: &[TaskId]) -> Result<Vec<TaskId>> {
    let ids: Vec<i64> = ids.iter().map(|id| id.0).collect();
    let mut tries = 0;
    loop {
        let mut tx = crate::pooler::begin(pool).await?;
        match db::admin::cancel_tasks(&mut tx, ids.clone()).await {
            Ok(cancelled) => {
                tx.commit().await?;
                return Ok(cancelled.into_iter().map(TaskId).collect());
            }
            Err(error) if db::run_again(&error, &mut tries) => {}
            Err(error) => return Err(error.into()),
        }
    }
}

/// Every queue's settings (each queue a worker ever served has a row), by
/// name.
pub async fn list_queues(pool: &PgPool) -> Result<Vec<QueueSettings>> {
    Ok(db::queues::list(pool).await?)
}

/// The queues `overview` counts tasks for that have no settings row: no
/// worker has served them yet and no operator set them, so they run with
/// the defaults (not paused, no limits, one task per key at a time).
/// Listings show them beside [`list_queues`]'s.
pub fn queues_without_settings<'a>(
    settings: &[QueueSettings],
    overview: &'a Overview,
) -> Vec<&'a QueueOverview> {
    overview
        .queues
        .iter()
        .filter(|o| !settings.iter().any(|s| s.name == o.queue))
        .collect()
}

/// A moment as the operator's views print it: `2026-11-30 16:15:21.123
/// UTC` (UTC always, to the millisecond).
pub fn show_time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string()
}

/// Checks a queue's name as [`set_queue`] does, writing nothing: for a
/// caller that looks the queue up first.
pub fn check_queue_name(queue: &str) -> Result<()> {
    crate::options::validate_queue(queue)
}

/// The largest global concurrency and per-key concurrency accepted.
pub const MAX_QUEUE_LIMIT: i32 = 1_000_000;

/// The highest rate accepted, per second.
pub const MAX_RATE_PER_SECOND: f64 = 1_000_000.0;

/// Changes a queue's settings for the whole cluster (adding its row if
/// needed) and returns them. A pause stops new claims at once everywhere
/// (running tasks finish); a global concurrency is never exceeded by a
/// claim made under it, however many workers serve the queue; a rate limits
/// the attempts started per second, cluster-wide. Values are checked
/// before anything is written.
pub async fn set_queue(pool: &PgPool, queue: &str, change: &QueueChange) -> Result<QueueSettings> {
    crate::options::validate_queue(queue)?;
    if let Some(Some(n)) = change.global_concurrency
        && !(1..=MAX_QUEUE_LIMIT).contains(&n)
    {
        return Err(Error::InvalidOption(format!(
            "global concurrency {n} is out of range: use 1 to {MAX_QUEUE_LIMIT}"
        )));
    }
    if let Some(n) = change.per_key_concurrency
        && !(1..=MAX_QUEUE_LIMIT).contains(&n)
    {
        return Err(Error::InvalidOption(format!(
            "per-key concurrency {n} is out of range: use 1 to {MAX_QUEUE_LIMIT}"
        )));
    }
    if let Some(Some(r)) = change.rate_per_second
        && !(r.is_finite() && r > 0.0 && r <= MAX_RATE_PER_SECOND)
    {
        return Err(Error::InvalidOption(format!(
            "rate {r}/s is out of range: use more than 0 and at most {MAX_RATE_PER_SECOND}/s"
        )));
    }
    Ok(db::queues::set(pool, queue, change).await?)
}

/// Pauses a queue cluster-wide: no new claims; running tasks finish.
pub async fn pause_queue(pool: &PgPool, queue: &str) -> Result<QueueSettings> {
    set_queue(pool, queue, &QueueChange::new().pause()).await
}

/// Resumes a paused queue; its workers are woken at once.
pub async fn resume_queue(pool: &PgPool, queue: &str) -> Result<QueueSettings> {
    set_queue(pool, queue, &QueueChange::new().resume()).await
}

/// Deletes a queue's settings (its pause and limits) for a queue left
/// behind: refused while a live worker serves it or tasks wait or run on
/// it. A worker that serves the queue later adds it back, with no limits.
pub async fn delete_queue(pool: &PgPool, queue: &str) -> Result<QueueDeletion> {
    crate::options::validate_queue(queue)?;
    Ok(db::queues::delete(pool, queue).await?)
}

/// Every worker that reported itself, live ones first.
pub async fn list_workers(pool: &PgPool) -> Result<Vec<WorkerRecord>> {
    Ok(db::workers::list(pool).await?)
}

/// Every task counted by type and state. Reads the whole table.
pub async fn count_by_type_and_state(pool: &PgPool) -> Result<Vec<TypeStateCount>> {
    Ok(db::admin::count_by_type_and_state(pool).await?)
}

/// Claimable, scheduled, processing and dead counts and the age of the
/// oldest claimable task, answered from partial indexes.
pub async fn queue_health(pool: &PgPool) -> Result<QueueHealth> {
    Ok(db::admin::queue_health(pool).await?)
}

fn check_state(state: Option<&str>) -> Result<()> {
    match state {
        Some(s) if !STATES.contains(&s) => Err(Error::InvalidOption(format!(
            "unknown state {s:?}: use one of {}",
            STATES.join(", ")
        ))),
        _ => Ok(()),
    }
}

/// The largest page [`search_tasks`] returns.
pub const MAX_PAGE: i64 = 500;

/// One page of tasks matching `filter`, newest first. Paging is by id
/// (pass the page's `next_before` as the next filter's `before`), so every
/// page costs the same however deep it is. The text filter is matched
/// literally (`%` and `_` are not wildcards).
pub async fn search_tasks(pool: &PgPool, filter: &TaskFilter) -> Result<TaskPage> {
    check_state(filter.state.as_deref())?;
    let limit = filter.limit.unwrap_or(50).clamp(1, MAX_PAGE);
    let pattern = filter
        .text
        .as_deref()
        .filter(|t| !t.is_empty())
        .map(|t| format!("%{}%", like_escaped(t)));
    let tasks = db::admin::search_tasks(pool, filter, pattern, limit).await?;
    let next_before = (tasks.len() as i64 == limit)
        .then(|| tasks.last().map(|t| t.id))
        .flatten();
    Ok(TaskPage { tasks, next_before })
}

/// `text` with LIKE's wildcards and escape character made literal.
fn like_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Every queue's live, running and dead tasks and last hour, the last hour
/// minute by minute, and an estimate of the completed history: answered
/// from partial indexes, the per-minute table and the planner's
/// statistics, so its cost does not grow with completed history.
pub async fn overview(pool: &PgPool) -> Result<Overview> {
    Ok(db::admin::overview(pool).await?)
}

/// None when the cluster knows queue `name`: it has settings (which a
/// worker writes for each of its queues when it starts) or tasks. Else the
/// names it knows, sorted, for the refusal (the CLI's and the dashboard's).
pub async fn unknown_queue(pool: &PgPool, name: &str) -> Result<Option<Vec<String>>> {
    let mut names: Vec<String> = list_queues(pool)
        .await?
        .into_iter()
        .map(|q| q.name)
        .collect();
    // Every queue a worker serves has its row: the counts (a look at every
    // live task's queue) only for a name without one.
    if names.iter().any(|n| n == name) {
        return Ok(None);
    }
    names.extend(overview(pool).await?.queues.into_iter().map(|q| q.queue));
    if names.iter().any(|n| n == name) {
        return Ok(None);
    }
    names.sort();
    names.dedup();
    Ok(Some(names))
}

/// The task types workers declared when they started (`outbox_task_types`)
/// and the types this program registers, sorted: what an operator's
/// `--type` can name, for a refusal or a hint when it names none of them.
pub async fn known_task_types(pool: &PgPool) -> Result<Vec<String>> {
    let mut types: Vec<String> = crate::pooler::on(pool, async |conn| {
        sqlx::query_scalar("SELECT task_type FROM outbox_task_types")
            .fetch_all(conn)
            .await
    })
    .await?;
    types.extend(
        crate::registered_tasks()
            .iter()
            .map(|r| r.task_type.to_owned()),
    );
    types.sort();
    types.dedup();
    Ok(types)
}

/// A rate, read back for the operator in the unit that makes it whole, as
/// it was most likely given (`--rate 5/m` is stored as 0.0833.../s): N/s,
/// N/m or N/h; else three significant digits in the first of those units
/// where it is at least 1, or per hour.
pub fn show_rate(per_second: f64) -> String {
    let units = [("s", 1.0), ("m", 60.0), ("h", 3600.0)];
    for (unit, seconds) in units {
        let n = per_second * seconds;
        if (n - n.round()).abs() < 1e-6 && n.round() >= 1.0 {
            return format!("{}/{unit}", n.round());
        }
    }
    let (unit, seconds) = units
        .into_iter()
        .find(|(_, seconds)| per_second * seconds >= 1.0)
        .unwrap_or(("h", 3600.0));
    let n = per_second * seconds;
    // Three significant digits, trailing zeros cut.
    let decimals = (2 - n.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let text = format!("{n:.decimals$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    format!("{text}/{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_wildcards_are_matched_literally() {
        assert_eq!(like_escaped("50%_off\\"), "50\\%\\_off\\\\");
        assert_eq!(like_escaped("plain"), "plain");
    }

    #[test]
    fn a_rate_is_shown_in_the_unit_that_makes_it_whole() {
        assert_eq!(show_rate(2.0), "2/s");
        assert_eq!(show_rate(5.0 / 60.0), "5/m");
        assert_eq!(show_rate(1.0 / 3600.0), "1/h");
        assert_eq!(show_rate(1.5), "90/m");
        assert_eq!(show_rate(1.0 / 7.0), "8.57/m");
        assert_eq!(show_rate(2.5 / 3600.0 / 7.0), "0.357/h");
        assert_eq!(show_rate(1_000_000.0), "1000000/s");
        // Whatever the stored value, never a zero or a panic.
        for r in [1e-12, 1e-6, 0.3, 1.0 / 3.0, 123_456.7, 999_999.99] {
            let shown = show_rate(r);
            assert!(
                !shown.starts_with("0/") && !shown.is_empty(),
                "{r}: {shown}"
            );
        }
    }
}
