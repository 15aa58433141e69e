//! Task types shared by the tests and the test worker binary.

use std::time::Duration;

use outbox::{
    HandlerError, HandlerResult, Outcome, TaskContext, TaskHandler, WorkerBuilder, outbox_task,
};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// The queue the recording task runs on.
pub const RECORD_QUEUE: &str = "record";

/// Records each execution in the `executions` table, then sleeps `ms`
/// (stopping early if the worker shuts down), then succeeds. Executions are
/// recorded when they start, so an execution cut short by a kill counts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.record", queue = "record", retry_delays = ["1s", "1s", "1s", "1s", "1s"])]
pub struct Record {
    /// How long the handler works.
    pub ms: u64,
}

/// Runs [`Record`].
#[derive(Debug, Clone, Copy)]
pub struct Recorder;

impl TaskHandler<Record> for Recorder {
    async fn handle(&self, ctx: TaskContext, task: Record) -> HandlerResult {
        // In a transaction, as every statement must be behind a pooler
        // (the fault tests run this worker through PgBouncer too).
        let mut tx = outbox::pooler::begin(ctx.pool()).await?;
        sqlx::query("INSERT INTO executions (task_id, attempt, pid) VALUES ($1, $2, $3)")
            .bind(ctx.id().0)
            .bind(ctx.attempt())
            .bind(i64::from(std::process::id()))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(task.ms)) => Ok(Outcome::Success),
            () = ctx.cancellation().cancelled() => Err(HandlerError::msg("cancelled by shutdown")),
        }
    }
}

/// Creates the table [`Record`] writes to.
pub async fn create_executions_table(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS executions (task_id bigint NOT NULL, attempt int NOT NULL, \
         pid bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(pool)
    .await
    .expect("create the executions table");
}

/// Ships an order: writes a row to `shipments` and completes the task in
/// the same transaction (`TaskContext::complete_in`). On its first attempt
/// it can kill its own process: `crash = "before"` after the writes and
/// before COMMIT, `"after"` right after COMMIT.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.ship", queue = "ship", retry_delays = ["1s", "1s", "1s"])]
pub struct Ship {
    /// The order shipped.
    pub order_id: i64,
    /// "before", "after" or "".
    pub crash: String,
}

/// Runs [`Ship`].
#[derive(Debug, Clone, Copy)]
pub struct Shipper;

impl TaskHandler<Ship> for Shipper {
    async fn handle(&self, ctx: TaskContext, task: Ship) -> HandlerResult {
        let mut tx = ctx.pool().begin().await?;
        sqlx::query("INSERT INTO shipments (order_id, task_id, attempt) VALUES ($1, $2, $3)")
            .bind(task.order_id)
            .bind(ctx.id().0)
            .bind(ctx.attempt())
            .execute(&mut *tx)
            .await?;
        ctx.complete_in(&mut tx).await?;
        if task.crash == "before" && ctx.attempt() == 1 {
            std::process::abort();
        }
        tx.commit().await?;
        if task.crash == "after" && ctx.attempt() == 1 {
            std::process::abort();
        }
        Ok(Outcome::Success)
    }
}

/// Creates the table [`Ship`] writes to.
pub async fn create_shipments_table(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS shipments (order_id bigint NOT NULL, task_id bigint NOT NULL, \
         attempt int NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("create the shipments table");
}

/// A step of an ordered sequence: tasks with the same `key` run one at a
/// time in commit order. Each attempt is recorded in `intervals` with its
/// start and end (database clock); an attempt up to `fail_first` fails, and
/// a `poison` step gives up (dead).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.step", queue = "ordered", ordering_key = "key", retry_delays = ["300ms", "300ms", "300ms"])]
pub struct Step {
    /// The ordering key.
    pub key: String,
    /// Its place in the key's sequence, as the submitter meant it.
    pub n: i64,
    /// How long the handler works.
    pub ms: u64,
    /// Attempts that fail before one succeeds.
    pub fail_first: i32,
    /// Give up at once: the task is dead.
    pub poison: bool,
}

impl Step {
    /// Step `n` of `key`, working `ms`, succeeding at its first attempt.
    pub fn new(key: &str, n: i64, ms: u64) -> Self {
        Self {
            key: key.to_owned(),
            n,
            ms,
            fail_first: 0,
            poison: false,
        }
    }
}

/// Work on the `limited` queue for the global concurrency and rate tests,
/// recorded in `intervals` like [`Step`]. An attempt cut short by a
/// database outage is retried soon.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.slot", queue = "limited", retry_delays = ["200ms", "200ms", "200ms", "200ms", "200ms"])]
pub struct Slot {
    /// How long the handler works.
    pub ms: u64,
}

/// Runs [`Step`] and [`Slot`].
#[derive(Debug, Clone, Copy)]
pub struct IntervalRecorder;

async fn record_interval(
    ctx: &TaskContext,
    key: Option<&str>,
    n: i64,
    ms: u64,
) -> Result<(), HandlerError> {
    let row: i64 = sqlx::query_scalar(
        "INSERT INTO intervals (task_id, key, n, attempt, pid) VALUES ($1, $2, $3, $4, $5) \
         RETURNING row_id",
    )
    .bind(ctx.id().0)
    .bind(key)
    .bind(n)
    .bind(ctx.attempt())
    .bind(i64::from(std::process::id()))
    .fetch_one(ctx.pool())
    .await?;
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(ms)) => {}
        () = ctx.cancellation().cancelled() => return Err(HandlerError::msg("cancelled")),
    }
    sqlx::query("UPDATE intervals SET finished_at = clock_timestamp() WHERE row_id = $1")
        .bind(row)
        .execute(ctx.pool())
        .await?;
    Ok(())
}

impl TaskHandler<Step> for IntervalRecorder {
    async fn handle(&self, ctx: TaskContext, task: Step) -> HandlerResult {
        record_interval(&ctx, Some(&task.key), task.n, task.ms).await?;
        if task.poison {
            return Ok(Outcome::GiveUp("poison step".to_owned()));
        }
        if ctx.attempt() <= task.fail_first {
            return Err(HandlerError::msg("planned failure"));
        }
        Ok(Outcome::Success)
    }
}

impl TaskHandler<Slot> for IntervalRecorder {
    async fn handle(&self, ctx: TaskContext, task: Slot) -> HandlerResult {
        record_interval(&ctx, None, 0, task.ms).await?;
        Ok(Outcome::Success)
    }
}

/// A keyed attempt recorded in `intervals` like [`Step`], whose end is
/// recorded even when its worker is cut off from the database: the
/// worker's own clock when the handler stopped (its work done, or told to
/// stop), written by a task of its own that tries until the database
/// takes it. For the test that a cut-off worker stops its handlers before
/// their tasks are taken over.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.guarded", queue = "guarded", ordering_key = "key")]
pub struct Guarded {
    /// The ordering key.
    pub key: String,
    /// Its place in the key's sequence.
    pub n: i64,
    /// How long the handler works.
    pub ms: u64,
}

/// Runs [`Guarded`].
#[derive(Debug, Clone, Copy)]
pub struct GuardedRecorder;

impl TaskHandler<Guarded> for GuardedRecorder {
    async fn handle(&self, ctx: TaskContext, task: Guarded) -> HandlerResult {
        let row: i64 = sqlx::query_scalar(
            "INSERT INTO intervals (task_id, key, n, attempt, pid) VALUES ($1, $2, $3, $4, $5) \
             RETURNING row_id",
        )
        .bind(ctx.id().0)
        .bind(&task.key)
        .bind(task.n)
        .bind(ctx.attempt())
        .bind(i64::from(std::process::id()))
        .fetch_one(ctx.pool())
        .await?;
        let result = tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(task.ms)) => Ok(Outcome::Success),
            () = ctx.cancellation().cancelled() => Err(HandlerError::msg("told to stop")),
        };
        let ended = sqlx::types::chrono::Utc::now();
        let pool = ctx.pool().clone();
        // Not aborted with the handler, and not bound by the database's
        // reachability now.
        tokio::spawn(async move {
            for _ in 0..1200 {
                let written = tokio::time::timeout(
                    Duration::from_secs(2),
                    sqlx::query("UPDATE intervals SET finished_at = $1 WHERE row_id = $2")
                        .bind(ended)
                        .bind(row)
                        .execute(&pool),
                )
                .await;
                if matches!(written, Ok(Ok(_))) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        result
    }
}

/// Creates the table [`Step`] and [`Slot`] write to.
pub async fn create_intervals_table(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS intervals (row_id bigserial PRIMARY KEY, task_id bigint NOT NULL, \
         key text, n bigint NOT NULL, attempt int NOT NULL, pid bigint NOT NULL, \
         started_at timestamptz NOT NULL DEFAULT clock_timestamp(), finished_at timestamptz)",
    )
    .execute(pool)
    .await
    .expect("create the intervals table");
}

/// One recorded attempt: key, step, attempt, start, end.
type Attempt = (
    String,
    i64,
    i32,
    sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>,
    Option<sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>>,
);

/// Checks in `intervals` that no attempt of a key overlapped the next one
/// (every attempt must have finished); returns each key's steps in the
/// order their attempts started.
pub async fn assert_one_at_a_time(pool: &PgPool) -> Vec<(String, Vec<i64>)> {
    let rows: Vec<Attempt> = sqlx::query_as(
        "SELECT key, n, attempt, started_at, finished_at FROM intervals ORDER BY key, started_at",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut by_key: Vec<(String, Vec<i64>)> = Vec::new();
    for pair in rows.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.0 == b.0 {
            let end = a.4.expect("every attempt finished");
            assert!(
                end <= b.3,
                "key {}: step {} (attempt {}) ran until {end}, step {} started at {}",
                a.0,
                a.1,
                a.2,
                b.1,
                b.3
            );
        }
    }
    for (key, n, ..) in rows {
        match by_key.last_mut() {
            Some((k, ns)) if *k == key => ns.push(n),
            _ => by_key.push((key, vec![n])),
        }
    }
    by_key
}

/// The most attempts recorded in `intervals` that overlapped at any
/// instant. An attempt without a recorded end (its process killed) counts
/// until its task's next attempt started, or until now.
pub async fn max_overlap(pool: &PgPool) -> i64 {
    overlap(pool, true).await
}

/// Like [`max_overlap`], counting only attempts whose end was recorded:
/// for a database outage, where an attempt's last write fails and its
/// attempt ends (its failure is written) at a time nobody recorded.
pub async fn max_overlap_of_finished(pool: &PgPool) -> i64 {
    overlap(pool, false).await
}

async fn overlap(pool: &PgPool, unfinished: bool) -> i64 {
    sqlx::query_scalar(
        "WITH spans AS ( \
           SELECT i.started_at, coalesce(i.finished_at, \
                    (SELECT min(n.started_at) FROM intervals n \
                     WHERE n.task_id = i.task_id AND n.started_at > i.started_at), \
                    clock_timestamp()) AS finished_at \
           FROM intervals i WHERE $1 OR i.finished_at IS NOT NULL) \
         SELECT coalesce(max(running), 0)::bigint FROM ( \
           SELECT sum(delta) OVER (ORDER BY at, delta) AS running FROM ( \
             SELECT started_at AS at, 1 AS delta FROM spans \
             UNION ALL \
             SELECT finished_at, -1 FROM spans) AS edges) AS r",
    )
    .bind(unfinished)
    .fetch_one(pool)
    .await
    .expect("max overlap")
}

/// Two durable steps with work between them: step "first" and step
/// "second" each record an execution in `executions` (attempt = the step:
/// 1 for "first", 2 for "second"), and the handler works `ms` between
/// them. Runs on the record queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.durable", queue = "record", retry_delays = ["1s", "1s", "1s", "1s", "1s"])]
pub struct TwoSteps {
    /// How long the handler works between the steps.
    pub ms: u64,
}

/// Runs [`TwoSteps`].
#[derive(Debug, Clone, Copy)]
pub struct TwoStepper;

impl TaskHandler<TwoSteps> for TwoStepper {
    async fn handle(&self, ctx: TaskContext, task: TwoSteps) -> HandlerResult {
        for (step, n) in [("first", 1), ("second", 2)] {
            ctx.step(step, || async {
                sqlx::query("INSERT INTO executions (task_id, attempt, pid) VALUES ($1, $2, $3)")
                    .bind(ctx.id().0)
                    .bind(n)
                    .bind(i64::from(std::process::id()))
                    .execute(ctx.pool())
                    .await?;
                Ok::<_, HandlerError>(n)
            })
            .await?;
            if n == 1 {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(task.ms)) => {}
                    () = ctx.cancellation().cancelled() => return Err(HandlerError::msg("cancelled by shutdown")),
                }
            }
        }
        Ok(Outcome::Success)
    }
}

/// Adds the harness's handlers to a worker.
pub fn register(builder: WorkerBuilder) -> WorkerBuilder {
    builder
        .handler::<Record>(Recorder)
        .handler::<TwoSteps>(TwoStepper)
        .handler::<Ship>(Shipper)
        .handler::<Step>(IntervalRecorder)
        .handler::<Slot>(IntervalRecorder)
        .handler::<Guarded>(GuardedRecorder)
}

/// Gives the task table statistics that say no task waits for a key, runs
/// or has died (500 pending rows of `queue`, analyzed, then deleted), and
/// keeps them while the test runs (no autovacuum on the table): what a
/// table analyzed right after a drain has, under which the worker's
/// statements must still find their tasks by primary key (migrations 19,
/// 27 and 34).
pub async fn stale_task_statistics(pool: &PgPool, queue: &str) {
    sqlx::query("ALTER TABLE outbox_tasks SET (autovacuum_enabled = false)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) \
         SELECT 'noop', $1, '{}', 1 FROM generate_series(1, 500)",
    )
    .bind(queue)
    .execute(pool)
    .await
    .unwrap();
    for sql in ["ANALYZE outbox_tasks", "DELETE FROM outbox_tasks"] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
}

/// Rows of the task table this session has fetched through any index so
/// far; the difference around a statement, in one transaction, is what it
/// read (the counts of earlier transactions may not be flushed yet).
pub async fn task_index_fetches(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT idx_tup_fetch FROM pg_stat_xact_user_tables \
         WHERE relid = 'outbox_tasks'::regclass",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}
