//! The driver seam: every SQL statement the engine runs lives in `sql/`, one
//! file per statement, and is called only through the functions here.

pub(crate) mod admin;
pub(crate) mod claim_fronts;
pub(crate) mod classify;
pub(crate) mod event_log;
pub(crate) mod events;
pub(crate) mod history;
pub(crate) mod intake;
pub(crate) mod queues;
pub(crate) mod session;
pub(crate) mod throughput;
pub(crate) mod unique;
pub(crate) mod workers;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

/// The channel `submit` notifies and workers listen on; the payload is the
/// queue name.
pub(crate) const NOTIFY_CHANNEL: &str = "outbox_tasks";

/// The channel operators' requests to workers go on: `cancel:<task id>`.
pub(crate) const CONTROL_CHANNEL: &str = "outbox_control";

/// One row to insert, already validated and serialised.
#[derive(Debug)]
pub(crate) struct NewTask {
    pub(crate) task_type: String,
    pub(crate) queue: String,
    pub(crate) payload: String,
    pub(crate) priority: i16,
    pub(crate) max_attempts: i32,
    pub(crate) run_at: Option<DateTime<Utc>>,
    pub(crate) delay_us: Option<i64>,
    pub(crate) unique: Option<UniqueRow>,
    pub(crate) ordering_key: Option<String>,
    /// When dead, the task lets its ordering key go on.
    pub(crate) skip_dead: bool,
}

/// A row's uniqueness, ready to write.
#[derive(Debug, Clone)]
pub(crate) struct UniqueRow {
    /// `task_type:key`; the period bucket is appended by the database.
    pub(crate) key: String,
    pub(crate) states: i16,
    pub(crate) period_us: Option<i64>,
}

/// Inserts `tasks` in one statement on the caller's connection (and so in
/// the caller's transaction), NOTIFYing the `notify` queues, and returns the
/// ids in input order.
pub(crate) async fn insert_tasks(
    conn: &mut PgConnection,
    tasks: Vec<NewTask>,
    notify: Vec<String>,
) -> sqlx::Result<Vec<i64>> {
    if let [t] = tasks.as_slice()
        && t.run_at.is_none()
        && t.delay_us.is_none()
        && t.ordering_key.is_none()
    {
        // Due now and unkeyed: the narrow intake row (migration 31). The
        // notify, if any, is of this task's queue.
        let t = tasks.into_iter().next().expect("one task");
        let sql = if notify.is_empty() {
            include_str!("sql/insert_intake.sql")
        } else {
            include_str!("sql/insert_intake_notify.sql")
        };
        let id = sqlx::query_scalar(sql)
            .bind(t.task_type)
            .bind(t.queue)
            .bind(t.payload)
            .bind(t.priority)
            .bind(t.max_attempts)
            .fetch_one(conn)
            .await?;
        return Ok(vec![id]);
    }
    if tasks.len() == 1 && notify.is_empty() {
        let t = tasks.into_iter().next().expect("one task");
        let id = sqlx::query_scalar(include_str!("sql/insert_task.sql"))
            .bind(t.task_type)
            .bind(t.queue)
            .bind(t.payload)
            .bind(t.priority)
            .bind(t.max_attempts)
            .bind(t.run_at)
            .bind(t.delay_us)
            .bind(t.ordering_key)
            .bind(t.skip_dead)
            .fetch_one(conn)
            .await?;
        return Ok(vec![id]);
    }
    let n = tasks.len();
    let mut task_type = Vec::with_capacity(n);
    let mut queue = Vec::with_capacity(n);
    let mut payload = Vec::with_capacity(n);
    let mut priority = Vec::with_capacity(n);
    let mut max_attempts = Vec::with_capacity(n);
    let mut run_at = Vec::with_capacity(n);
    let mut delay_us = Vec::with_capacity(n);
    let mut ordering_key = Vec::with_capacity(n);
    let mut skip_dead = Vec::with_capacity(n);
    for t in tasks {
        ordering_key.push(t.ordering_key);
        skip_dead.push(t.skip_dead);
        task_type.push(t.task_type);
        queue.push(t.queue);
        payload.push(t.payload);
        priority.push(t.priority);
        max_attempts.push(t.max_attempts);
        run_at.push(t.run_at);
        delay_us.push(t.delay_us);
    }
    let rows = sqlx::query(include_str!("sql/insert_tasks.sql"))
        .bind(task_type)
        .bind(queue)
        .bind(payload)
        .bind(priority)
        .bind(max_attempts)
        .bind(run_at)
        .bind(delay_us)
        .bind(notify)
        .bind(ordering_key)
        .bind(skip_dead)
        .fetch_all(conn)
        .await?;
    rows.iter().map(|r| r.try_get("id")).collect()
}

/// A task claimed by TX1, as the worker needs it to run one attempt.
#[derive(Debug, Clone)]
pub(crate) struct ClaimedTask {
    pub(crate) id: i64,
    pub(crate) task_type: String,
    pub(crate) queue: String,
    pub(crate) payload: String,
    pub(crate) retry_count: i32,
    pub(crate) max_attempts: i32,
    pub(crate) claims: i32,
    /// It has an ordering key.
    pub(crate) ordered: bool,
    /// Its place in its ordering key's commit order.
    pub(crate) key_seq: Option<i64>,
    /// When it was submitted.
    pub(crate) created_at: DateTime<Utc>,
    /// The submitter's trace context (a W3C traceparent), if it had one.
    #[cfg_attr(
        not(feature = "otel"),
        expect(dead_code, reason = "only the otel feature continues traces")
    )]
    pub(crate) trace_context: Option<String>,
    /// The workflow it is a step of: its outcome goes down that workflow's
    /// outcome lane (see worker/completer.rs). Unknown (None) for a task a
    /// key was handed on to (the tasks of its run know theirs), which is
    /// then routed as a plain task.
    pub(crate) workflow_id: Option<i64>,
    /// The claim token written to claimed_by: unique to the claim statement
    /// that took the task, and the fence of everything written about this
    /// attempt afterwards.
    pub(crate) token: Arc<str>,
    /// The tasks of its ordering key claimed with it to run after it, in
    /// key order (a run, migration 28): each starts once the outcome of the
    /// one before it has committed (see worker/runs.rs).
    pub(crate) run: Vec<ClaimedTask>,
    /// It was claimed behind another task of its key, in that task's run.
    pub(crate) follows: bool,
}

impl ClaimedTask {
    /// The task and the rest of its run, as held: (id, claim token).
    pub(crate) fn held(&self) -> impl Iterator<Item = (i64, Arc<str>)> + '_ {
        std::iter::once(self)
            .chain(&self.run)
            .map(|t| (t.id, Arc::clone(&t.token)))
    }
}

/// A place in the claim order: (priority, execute_at, id), smallest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ClaimPosition {
    pub(crate) priority: i16,
    pub(crate) execute_at: DateTime<Utc>,
    pub(crate) id: i64,
}

impl ClaimPosition {
    /// Before every task (priorities start at 0): a claim from here reads
    /// the claimable index from its front.
    pub(crate) const START: ClaimPosition = ClaimPosition {
        priority: -1,
        execute_at: DateTime::UNIX_EPOCH,
        id: 0,
    };

    /// The place just before this one: a claim that reads above it reads
    /// this one first.
    pub(crate) fn just_before(self) -> ClaimPosition {
        ClaimPosition {
            id: self.id.saturating_sub(1),
            ..self
        }
    }
}

/// Where a claim starts reading the claimable index (see claim_tasks.sql).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimStart {
    /// Read above this first.
    pub(crate) floor: ClaimPosition,
    /// Read below the floor from here only (same priority as the floor).
    pub(crate) front: Option<ClaimPosition>,
}

impl ClaimStart {
    /// The whole index, in claim order.
    pub(crate) const FRONT: ClaimStart = ClaimStart {
        floor: ClaimPosition::START,
        front: None,
    };
}

/// What a claim took: the tasks, and the first and last of them in the
/// claim order.
pub(crate) struct Claimed {
    pub(crate) tasks: Vec<ClaimedTask>,
    pub(crate) first: Option<ClaimPosition>,
    pub(crate) last: Option<ClaimPosition>,
    /// The highest id of the intake the claim moved, if it moved any.
    pub(crate) intake_to: Option<i64>,
}

/// TX1: claims up to `limit` due tasks of `queue` under claim `token`,
/// reading from `start` (see claim_tasks.sql). Each keyed task comes with
/// the run of its key's tasks claimed behind it, up to `run_length` tasks
/// in all (1: none; see migration 28). First it moves tasks of the intake
/// with ids above `intake_above` into outbox_tasks (none when `None`).
#[expect(
    clippy::too_many_arguments,
    reason = "one per parameter of the claim statement; a struct would only rename them"
)]
pub(crate) async fn claim_tasks(
    conn: &mut PgConnection,
    queue: &str,
    limit: usize,
    token: &Arc<str>,
    now: Option<DateTime<Utc>>,
    start: ClaimStart,
    run_length: usize,
    intake_above: Option<i64>,
) -> sqlx::Result<Claimed> {
    let rows = sqlx::query(include_str!("sql/claim_tasks.sql"))
        .bind(queue.to_owned())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(token.to_string())
        .bind(now)
        .bind(start.floor.priority)
        .bind(start.floor.execute_at)
        .bind(start.floor.id)
        .bind(start.front.map(|f| f.execute_at))
        .bind(start.front.map(|f| f.id))
        .bind(i32::try_from(run_length).unwrap_or(i32::MAX))
        .bind(intake_above)
        .fetch_all(conn)
        .await?;
    let intake_to = intake_moved_to(&rows)?;
    let mut placed = Vec::with_capacity(rows.len());
    // The rest of each run, by its key, in key order once sorted.
    let mut runs: HashMap<String, Vec<ClaimedTask>> = HashMap::new();
    let mut heads: HashMap<String, usize> = HashMap::new();
    for r in &rows {
        if r.try_get::<Option<i64>, _>("id")?.is_none() {
            // Nothing claimed: the row that says how far the move went.
            continue;
        }
        let task = claimed_task(r, token)?;
        if r.try_get::<bool, _>("follows")? {
            let key: String = r.try_get("ordering_key")?;
            runs.entry(key).or_default().push(task);
            continue;
        }
        if let Some(key) = r.try_get::<Option<String>, _>("ordering_key")? {
            heads.insert(key, placed.len());
        }
        let at = ClaimPosition {
            priority: r.try_get("priority")?,
            execute_at: r.try_get("execute_at")?,
            id: task.id,
        };
        placed.push((at, task));
    }
    for (key, mut run) in runs {
        run.sort_unstable_by_key(|t| t.key_seq);
        match heads.get(&key) {
            Some(&head) => placed[head].1.run = run,
            // Cannot happen (a run is claimed with its head); if it did, its
            // tasks would run out of order, so they stay held and unstarted
            // until this worker releases them or recovery returns them.
            None => tracing::error!(
                task_ids = ?run.iter().map(|t| t.id).collect::<Vec<_>>(),
                "a claim returned a run without its head"
            ),
        }
    }
    // The statement returns them in id order; they start in claim order.
    placed.sort_unstable_by_key(|(at, _)| *at);
    Ok(Claimed {
        first: placed.first().map(|(at, _)| *at),
        last: placed.last().map(|(at, _)| *at),
        tasks: placed.into_iter().map(|(_, task)| task).collect(),
        intake_to,
    })
}

/// How far a claim's move of the intake went: every row says it.
pub(crate) fn intake_moved_to(rows: &[sqlx::postgres::PgRow]) -> sqlx::Result<Option<i64>> {
    match rows.first() {
        Some(r) => r.try_get("intake_to"),
        None => Ok(None),
    }
}

/// One row a claim returned.
fn claimed_task(r: &sqlx::postgres::PgRow, token: &Arc<str>) -> sqlx::Result<ClaimedTask> {
    Ok(ClaimedTask {
        id: r.try_get("id")?,
        task_type: r.try_get("task_type")?,
        queue: r.try_get("queue")?,
        payload: r.try_get("payload")?,
        retry_count: r.try_get("retry_count")?,
        max_attempts: r.try_get("max_attempts")?,
        claims: r.try_get("claims")?,
        ordered: r.try_get("ordered")?,
        key_seq: r.try_get("key_seq")?,
        created_at: r.try_get("created_at")?,
        trace_context: r.try_get("trace_context")?,
        workflow_id: r.try_get("workflow_id")?,
        token: Arc::clone(token),
        run: Vec::new(),
        // Only a claim's rows say (a hand-on's rows are its heads: the
        // tasks of their runs are marked where they are read).
        follows: match r.try_get("follows") {
            Ok(follows) => follows,
            Err(sqlx::Error::ColumnNotFound(_)) => false,
            Err(error) => return Err(error),
        },
    })
}

/// The state an attempt's outcome moves a task to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextState {
    /// Done for good.
    Completed,
    /// Failed; claimable again at its execute_at unless dead.
    Failed,
    /// Back to waiting without counting an attempt.
    Pending,
}

impl NextState {
    fn as_sql(self) -> &'static str {
        match self {
            NextState::Completed => "completed",
            NextState::Failed => "failed",
            NextState::Pending => "pending",
        }
    }
}

/// The outcome of one attempt, ready to be written by TX2.
#[derive(Debug, Clone)]
pub(crate) struct Finish {
    pub(crate) id: i64,
    pub(crate) claims: i32,
    /// The claim token of the attempt (the fence, with `claims`).
    pub(crate) token: Arc<str>,
    pub(crate) state: NextState,
    pub(crate) add_retry: i32,
    pub(crate) delay_us: i64,
    pub(crate) dead: bool,
    pub(crate) error: Option<String>,
    /// A handler's result, as JSON text.
    pub(crate) result: Option<String>,
    /// When the attempt started, for a task of a run (claimed before it
    /// started); None: the claim's moment stands.
    pub(crate) started_at: Option<DateTime<Utc>>,
}

/// A completion's offer to claim the next task of each ordering key it lets
/// go of, for this worker (see migration 17): per queue, how many places
/// the worker has free, and the claim token of what it takes. Each task
/// taken comes with the tasks waiting behind it in its key's line, up to
/// `run_length` in all (a run, migration 46).
#[derive(Debug)]
pub(crate) struct HandOnOffer {
    pub(crate) queues: Vec<String>,
    pub(crate) places: Vec<i32>,
    pub(crate) token: Arc<str>,
    pub(crate) run_length: i32,
}

/// What a completion wrote and handed on.
#[derive(Debug, Default)]
pub(crate) struct Completed {
    /// The ids of the outcomes written (a fenced-out stale one is missing).
    pub(crate) written: Vec<i64>,
    /// Tasks handed their key and claimed for this worker under the offer's
    /// token, each with its run.
    pub(crate) claimed: Vec<ClaimedTask>,
    /// Queues of tasks handed their key but not claimed (woken by NOTIFY).
    pub(crate) woken: Vec<String>,
    /// Keys let go of but not handed on: another transaction held their
    /// row. They are owed a hand-over ([`hand_on_deferred_keys`]).
    pub(crate) deferred: Vec<QueueKey>,
    /// Tasks whose run was to go on but ends here (their queue was paused
    /// or given limits since, or the run's next task is no longer this
    /// worker's): they let go of their key, and the rest of the run is
    /// given back (worker/runs.rs).
    pub(crate) halted: Vec<i64>,
    /// Written, but dead instead of what the attempt said: an operator
    /// asked to cancel the task, and the worker may not have heard.
    pub(crate) cancelled: Vec<i64>,
}

impl Completed {
    /// Takes in an outcome statement's row for an outcome written: its id,
    /// and whether its run ends there or a cancel made it dead.
    fn note_written(&mut self, r: &sqlx::postgres::PgRow) -> sqlx::Result<()> {
        let id = r.try_get("id")?;
        self.written.push(id);
        if r.try_get::<Option<bool>, _>("run_halted")? == Some(true) {
            self.halted.push(id);
        }
        if r.try_get::<Option<bool>, _>("cancelled")? == Some(true) {
            self.cancelled.push(id);
        }
        Ok(())
    }
}

/// An ordering key, with its queue.
pub(crate) type QueueKey = (String, String);

/// Reads an outcome statement's row that names a key it could not hand on.
fn deferred_key(r: &sqlx::postgres::PgRow) -> sqlx::Result<Option<QueueKey>> {
    r.try_get::<Option<String>, _>("deferred_key")?
        .map(|key| r.try_get::<String, _>("queue").map(|queue| (queue, key)))
        .transpose()
}

/// Hands on ordering keys whose outcomes could not take them (see
/// [`Completed::deferred`]); returns those whose row another transaction
/// still holds.
pub(crate) async fn hand_on_deferred_keys(
    conn: &mut PgConnection,
    keys: &[QueueKey],
) -> sqlx::Result<Vec<QueueKey>> {
    sqlx::query_as(include_str!("sql/hand_on_deferred_keys.sql"))
        .bind(keys.iter().map(|(q, _)| q.as_str()).collect::<Vec<_>>())
        .bind(keys.iter().map(|(_, k)| k.as_str()).collect::<Vec<_>>())
        .fetch_all(conn)
        .await
}

/// TX2 for successes only: marks them COMPLETED, or deletes them when
/// `delete` (retention zero), and hands each ordering key let go of to its
/// next task, claiming that task for this worker if `offer` allows it,
/// with the tasks waiting behind it as its run (migration 46).
/// A task in `continuing` (with the next task of its run) keeps its key
/// while that next task is still this worker's: it runs here next
/// (migration 28); otherwise the run ends (`Completed::halted`).
pub(crate) async fn complete_tasks(
    conn: &mut PgConnection,
    batch: &[&Finish],
    delete: bool,
    now: Option<DateTime<Utc>>,
    offer: Option<&HandOnOffer>,
    continuing: &[(i64, i64)],
) -> sqlx::Result<Completed> {
    let ids: Vec<i64> = batch.iter().map(|f| f.id).collect();
    let claims: Vec<i32> = batch.iter().map(|f| f.claims).collect();
    let tokens: Vec<&str> = batch.iter().map(|f| &*f.token).collect();
    // Runs are taken only with an offer: the statement that takes them
    // costs every outcome more, and most outcomes of a hot key's run offer
    // nothing (their run goes on).
    let takes_runs = offer.is_some_and(|o| o.run_length > 1);
    // The plain statement, wrapped by hand_on_runs.sql when it takes runs.
    macro_rules! taking_runs {
        ($plain:literal) => {
            concat!(
                "WITH o AS MATERIALIZED (\n",
                include_str!($plain),
                include_str!("sql/hand_on_runs.sql")
            )
        };
    }
    let sql = match (delete, takes_runs) {
        (false, false) => include_str!("sql/complete_tasks.sql"),
        (true, false) => include_str!("sql/delete_completed_tasks.sql"),
        (false, true) => taking_runs!("sql/complete_tasks.sql"),
        (true, true) => taking_runs!("sql/delete_completed_tasks.sql"),
    };
    let query = sqlx::query(sql)
        .bind(ids)
        .bind(claims)
        .bind(tokens)
        .bind(now)
        .bind(offer.map(|o| o.queues.as_slice()).unwrap_or_default())
        .bind(offer.map(|o| o.places.as_slice()).unwrap_or_default())
        .bind(offer.map(|o| o.token.to_string()))
        .bind(continuing.iter().map(|(id, _)| *id).collect::<Vec<_>>())
        .bind(attempts_started(batch))
        .bind(continuing.iter().map(|(_, next)| *next).collect::<Vec<_>>());
    let rows = if takes_runs {
        query.bind(offer.map(|o| o.run_length))
    } else {
        query
    }
    .fetch_all(conn)
    .await?;
    let mut completed = Completed::default();
    // The rest of each run handed on, by its head.
    let mut runs: HashMap<i64, Vec<ClaimedTask>> = HashMap::new();
    for r in &rows {
        if let Some(key) = deferred_key(r)? {
            completed.deferred.push(key);
        } else if !r.try_get::<bool, _>("handed")? {
            completed.note_written(r)?;
        } else if let Some(offer) = offer
            && r.try_get::<bool, _>("claimed")?
        {
            let mut task = claimed_task(r, &offer.token)?;
            // Only the statement that takes runs has the column.
            let run_of: Option<i64> = if takes_runs {
                r.try_get("run_of")?
            } else {
                None
            };
            match run_of {
                Some(head) => {
                    task.follows = true;
                    runs.entry(head).or_default().push(task);
                }
                None => completed.claimed.push(task),
            }
        } else {
            completed.woken.push(r.try_get("queue")?);
        }
    }
    for head in &mut completed.claimed {
        if let Some(mut run) = runs.remove(&head.id) {
            run.sort_unstable_by_key(|t| t.key_seq);
            head.run = run;
        }
    }
    // Cannot happen (a run is claimed behind a task handed on here); if it
    // did, its tasks would run out of order, so they stay claimed and
    // unstarted (not in this worker's holdings, so not heartbeated) until
    // stuck-task recovery returns them.
    for (head, run) in runs {
        tracing::error!(
            head,
            task_ids = ?run.iter().map(|t| t.id).collect::<Vec<_>>(),
            "a hand-on returned a run without its head"
        );
    }
    Ok(completed)
}

/// TX2: writes a batch of outcomes in one statement; returns the ids that
/// were written (a fenced-out stale outcome is missing from it), the keys
/// let go of that it could not hand on, and those of `continuing` (tasks
/// whose run would go on, with its next task) whose run ends here: the
/// queue was paused or given limits since, or the next task is no longer
/// this worker's.
pub(crate) async fn finish_tasks(
    conn: &mut PgConnection,
    batch: &[&Finish],
    now: Option<DateTime<Utc>>,
    continuing: &[(i64, i64)],
) -> sqlx::Result<Completed> {
    let rows = sqlx::query(include_str!("sql/finish_tasks.sql"))
        .bind(batch.iter().map(|f| f.id).collect::<Vec<_>>())
        .bind(batch.iter().map(|f| f.claims).collect::<Vec<_>>())
        .bind(batch.iter().map(|f| &*f.token).collect::<Vec<_>>())
        .bind(batch.iter().map(|f| f.state.as_sql()).collect::<Vec<_>>())
        .bind(batch.iter().map(|f| f.add_retry).collect::<Vec<_>>())
        .bind(batch.iter().map(|f| f.delay_us).collect::<Vec<_>>())
        .bind(batch.iter().map(|f| f.dead).collect::<Vec<_>>())
        .bind(batch.iter().map(|f| f.error.as_deref()).collect::<Vec<_>>())
        .bind(now)
        .bind(
            batch
                .iter()
                .map(|f| f.result.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(attempts_started(batch))
        .bind(continuing.iter().map(|(id, _)| *id).collect::<Vec<_>>())
        .bind(continuing.iter().map(|(_, next)| *next).collect::<Vec<_>>())
        .fetch_all(conn)
        .await?;
    let mut done = Completed::default();
    for r in &rows {
        match deferred_key(r)? {
            Some(key) => done.deferred.push(key),
            None => done.note_written(r)?,
        }
    }
    Ok(done)
}

/// When each attempt of a batch started, if any is a task of a run (see
/// [`Finish::started_at`]); none otherwise, which spares the statement a
/// look at every attempt.
fn attempts_started(batch: &[&Finish]) -> Option<Vec<Option<DateTime<Utc>>>> {
    batch
        .iter()
        .any(|f| f.started_at.is_some())
        .then(|| batch.iter().map(|f| f.started_at).collect())
}

/// Gives back the rest of a run (see release_run.sql): returns the ids put
/// back and the keys it could not hand on yet.
pub(crate) async fn release_run(
    conn: &mut PgConnection,
    tasks: &[(i64, Arc<str>)],
) -> sqlx::Result<(Vec<i64>, Vec<QueueKey>)> {
    let rows = sqlx::query(include_str!("sql/release_run.sql"))
        .bind(tasks.iter().map(|(id, _)| *id).collect::<Vec<_>>())
        .bind(tasks.iter().map(|(_, t)| &**t).collect::<Vec<_>>())
        .fetch_all(conn)
        .await?;
    let mut released = Vec::with_capacity(rows.len());
    let mut deferred = Vec::new();
    for r in &rows {
        match deferred_key(r)? {
            Some(key) => deferred.push(key),
            None => released.push(r.try_get("id")?),
        }
    }
    Ok((released, deferred))
}

/// The fallback when one outcome was rejected for good: the attempt counts
/// as failed with `error` (dead if it was the last), so the task leaves
/// PROCESSING visibly instead of waiting for recovery. Returns whether the
/// row was still this attempt's.
pub(crate) async fn fail_unwritable(
    conn: &mut PgConnection,
    finish: &Finish,
    error: &str,
) -> sqlx::Result<bool> {
    let done: Option<i64> = sqlx::query_scalar(include_str!("sql/fail_unwritable.sql"))
        .bind(finish.id)
        .bind(&*finish.token)
        .bind(error)
        .fetch_optional(conn)
        .await?;
    Ok(done.is_some())
}

/// What a heartbeat found.
#[derive(Debug, Default)]
pub(crate) struct Beat {
    /// The tasks still held under one of the tokens: the rest of those
    /// asked about are no longer this worker's.
    pub(crate) kept: Vec<i64>,
    /// Held tasks an operator asked to cancel.
    pub(crate) cancel: Vec<i64>,
}

/// Bumps heartbeat_at of `ids` still held under one of `tokens`.
pub(crate) async fn heartbeat(
    conn: &mut PgConnection,
    ids: &[i64],
    tokens: &[Arc<str>],
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<Beat> {
    let rows = sqlx::query(include_str!("sql/heartbeat.sql"))
        .bind(ids)
        .bind(tokens.iter().map(|t| &**t).collect::<Vec<_>>())
        .bind(now)
        .fetch_all(conn)
        .await?;
    let mut beat = Beat::default();
    for r in &rows {
        let id = r.try_get("id")?;
        beat.kept.push(id);
        if r.try_get::<bool, _>("cancel")? {
            beat.cancel.push(id);
        }
    }
    Ok(beat)
}

/// Puts every task still held under one of `tokens` back to PENDING without
/// counting an attempt; returns their ids.
pub(crate) async fn release_claims(
    conn: &mut PgConnection,
    tokens: &[Arc<str>],
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar(include_str!("sql/release_claims.sql"))
        .bind(tokens.iter().map(|t| &**t).collect::<Vec<_>>())
        .bind(None::<Vec<i64>>)
        .fetch_all(conn)
        .await
}

/// Puts these held tasks (id, claim token) back to PENDING without counting
/// an attempt: claimed ahead, their handlers never started. Returns the ids
/// released.
pub(crate) async fn release_unstarted(
    conn: &mut PgConnection,
    tasks: &[(i64, Arc<str>)],
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar(include_str!("sql/release_claims.sql"))
        .bind(tasks.iter().map(|(_, t)| &**t).collect::<Vec<_>>())
        .bind(tasks.iter().map(|(id, _)| *id).collect::<Vec<_>>())
        .fetch_all(conn)
        .await
}

/// Recovers up to `limit` stuck tasks; returns (id, now dead) pairs. With
/// `leader`, only while that worker holds the maintenance lease.
pub(crate) async fn recover_stuck(
    conn: &mut PgConnection,
    timeout_us: i64,
    limit: i64,
    now: Option<DateTime<Utc>>,
    leader: Option<&str>,
) -> sqlx::Result<Vec<(i64, bool)>> {
    sqlx::query_as(include_str!("sql/recover_stuck.sql"))
        .bind(timeout_us)
        .bind(limit)
        .bind(now)
        .bind(leader)
        .fetch_all(conn)
        .await
}

/// Gives back up to `limit` tasks held in place for a run that nothing will
/// run or give back (release_orphan_holds.sql); returns their ids. With
/// `leader`, only while that worker holds the maintenance lease.
pub(crate) async fn release_orphan_holds(
    conn: &mut PgConnection,
    now: Option<DateTime<Utc>>,
    leader: Option<&str>,
    limit: i64,
    timeout_us: i64,
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar(include_str!("sql/release_orphan_holds.sql"))
        .bind(now)
        .bind(leader)
        .bind(limit)
        .bind(timeout_us)
        .fetch_all(conn)
        .await
}

/// Deletes one batch of expired COMPLETED tasks; returns how many.
pub(crate) async fn cleanup_completed(
    conn: &mut PgConnection,
    retention_us: i64,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    delete_expired(
        conn,
        include_str!("sql/cleanup_completed.sql"),
        retention_us,
        limit,
        now,
    )
    .await
}

/// Runs one bounded retention batch: `sql` takes the retention in
/// microseconds ($1), the batch size ($2) and a clock override ($3, null
/// for the database's now()). Returns how many rows it deleted.
pub(crate) async fn delete_expired(
    conn: &mut PgConnection,
    sql: &'static str,
    retention_us: i64,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    let done = sqlx::query(sql)
        .bind(retention_us)
        .bind(limit)
        .bind(now)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

/// How often an operator's transaction runs again when PostgreSQL aborted
/// it to break a deadlock or a serialization conflict.
const RACE_RETRIES: u32 = 5;

/// Whether an operator's transaction that failed with `error` runs again
/// from its start: PostgreSQL aborted it to break a deadlock or a
/// serialization conflict (a cancel locks keys, then tasks, and can lose
/// to the engine), and it has not run [`RACE_RETRIES`] more times yet.
pub(crate) fn run_again(error: &sqlx::Error, tries: &mut u32) -> bool {
    if *tries >= RACE_RETRIES || !classify::lost_a_race(error) {
        return false;
    }
    *tries += 1;
    tracing::info!(%error, tries, "an operator's transaction lost a race; running it again");
    true
}

/// Takes or renews lease `name` for `holder` for `ttl_us`, recording the
/// `settings` it applies meanwhile (JSON); returns `None` when `holder`
/// does not hold it now, else whether its leadership began with this call
/// (taken, or taken back after it ran out) rather than went on.
pub(crate) async fn acquire_lease(
    conn: &mut PgConnection,
    name: &str,
    holder: &str,
    ttl_us: i64,
    settings: Option<&serde_json::Value>,
) -> sqlx::Result<Option<bool>> {
    let held: Option<(i64, bool)> = sqlx::query_as(include_str!("sql/acquire_lease.sql"))
        .bind(name)
        .bind(holder)
        .bind(ttl_us)
        .bind(settings)
        .fetch_optional(conn)
        .await?;
    Ok(held.map(|(_, began)| began))
}

/// The live holder of lease `name` and the settings it recorded, if any
/// worker holds it now.
pub(crate) async fn lease_holder(
    conn: &mut PgConnection,
    name: &str,
) -> sqlx::Result<Option<(String, Option<serde_json::Value>)>> {
    sqlx::query_as(include_str!("sql/lease_holder.sql"))
        .bind(name)
        .fetch_optional(conn)
        .await
}

/// Gives lease `name` up at once if `holder` has it.
pub(crate) async fn release_lease(
    conn: &mut PgConnection,
    name: &str,
    holder: &str,
) -> sqlx::Result<()> {
    sqlx::query(include_str!("sql/release_lease.sql"))
        .bind(name)
        .bind(holder)
        .execute(conn)
        .await?;
    Ok(())
}

/// Makes sure partitions cover now through `ahead_us` later, each
/// `width_us` wide, with `cover` (a statement taking a time and a width,
/// returning whether it created a partition), one statement and
/// transaction each, the furthest first; returns how many were created. A
/// partition that cannot be made now (a lock not granted at once) does not
/// stop the others: the first such error is returned after trying them
/// all.
pub(crate) async fn cover_ahead(
    conn: &mut PgConnection,
    cover: &'static str,
    ahead_us: i64,
    width_us: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    let times: Vec<DateTime<Utc>> = sqlx::query_scalar(include_str!("sql/partition_times.sql"))
        .bind(ahead_us)
        .bind(width_us)
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
    let mut created = 0;
    let mut failed = None;
    for t in times {
        let made: sqlx::Result<bool> = sqlx::query_scalar(cover)
            .bind(t)
            .bind(width_us)
            .fetch_one(&mut *conn)
            .await;
        match made {
            Ok(true) => created += 1,
            Ok(false) => {}
            Err(error) => {
                failed.get_or_insert(error);
            }
        }
    }
    match failed {
        Some(error) => Err(error),
        None => Ok(created),
    }
}
