//! What a failed attempt writes: retries per the table, dead when it is used
//! up, and the handler's other outcomes. The clock is pinned, not slept on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::{
    Clock, HandlerError, HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, TaskId,
    Worker, outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

const WAIT: Duration = Duration::from_secs(20);

/// Fails with "boom <n>" unless told to give up or to snooze.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.failures.flaky", queue = "failure-tests")]
struct Flaky {
    give_up: bool,
    snooze_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.failures.doomed", queue = "failure-tests-doomed", retry_delays = ["1m", "10m"])]
struct Doomed {}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.failures.marker", queue = "failure-tests-doomed")]
struct Marker {}

#[derive(Clone, Default)]
struct Calls(Arc<AtomicUsize>);

impl TaskHandler<Flaky> for Calls {
    async fn handle(&self, ctx: TaskContext, task: Flaky) -> HandlerResult {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        if task.give_up {
            return Ok(Outcome::GiveUp(format!(
                "gave up on attempt {}",
                ctx.attempt()
            )));
        }
        if let Some(ms) = task.snooze_ms {
            return Ok(Outcome::RetryAfter(Duration::from_millis(ms)));
        }
        Err(HandlerError::msg(format!("boom {n}")))
    }
}

impl TaskHandler<Doomed> for Calls {
    async fn handle(&self, ctx: TaskContext, _task: Doomed) -> HandlerResult {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(std::io::Error::other(format!(
            "attempt {} of {} failed",
            ctx.attempt(),
            ctx.max_attempts()
        ))
        .into())
    }
}

impl TaskHandler<Marker> for Calls {
    async fn handle(&self, _ctx: TaskContext, _task: Marker) -> HandlerResult {
        Ok(Outcome::Success)
    }
}

#[derive(Debug)]
struct Row {
    state: String,
    retry_count: i32,
    claims: i32,
    last_error: Option<String>,
    execute_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    dead_at: Option<DateTime<Utc>>,
}

type RowTuple = (
    String,
    i32,
    i32,
    Option<String>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

async fn row(db: &TestDb, id: TaskId) -> Row {
    let (state, retry_count, claims, last_error, execute_at, finished_at, dead_at): RowTuple = sqlx::query_as(
        "SELECT state::text AS state, retry_count, claims, last_error, execute_at, finished_at, dead_at \
         FROM outbox_all_tasks WHERE id = $1",
    )
    .bind(id.0)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    Row {
        state,
        retry_count,
        claims,
        last_error,
        execute_at,
        finished_at,
        dead_at,
    }
}

/// A pinned clock an hour ahead of the database, so that every task
/// submitted now is already due.
fn pinned_clock() -> (Clock, DateTime<Utc>) {
    // Whole microseconds: what PostgreSQL stores.
    let at = DateTime::from_timestamp_micros(
        (Utc::now() + chrono::Duration::hours(1)).timestamp_micros(),
    )
    .unwrap();
    (Clock::fixed(at), at)
}

/// Submits one `Flaky` task, runs it once on a pinned clock until an
/// outcome of `kind` is committed, and returns its row, the pinned time and
/// the number of handler calls.
async fn run_flaky_once(task: Flaky, kind: TaskEventKind) -> (Row, DateTime<Utc>, usize) {
    let db = TestDb::migrated().await;
    let id = outbox::submit(&mut *db.conn().await, task).await.unwrap();
    let (clock, now) = pinned_clock();
    let calls = Calls::default();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Flaky>(calls.clone())
            .clock(clock)
            .build()
            .unwrap(),
    );
    worker.wait_for(kind, 1, WAIT).await;
    worker.stop().await;
    (row(&db, id).await, now, calls.0.load(Ordering::SeqCst))
}

#[tokio::test]
async fn a_failure_stores_the_error_and_schedules_the_first_retry_delay() {
    let (r, now, calls) = run_flaky_once(
        Flaky {
            give_up: false,
            snooze_ms: None,
        },
        TaskEventKind::Failed,
    )
    .await;
    assert_eq!(r.state, "failed", "{r:?}");
    assert_eq!(r.retry_count, 1, "{r:?}");
    assert_eq!(r.last_error.as_deref(), Some("boom 1"));
    assert_eq!(r.finished_at, Some(now));
    // The default table's first delay, a minute, within the default
    // jitter of 10% either way.
    assert!(
        r.execute_at >= now + chrono::Duration::seconds(54)
            && r.execute_at <= now + chrono::Duration::seconds(66),
        "first delay of the default table: {r:?}"
    );
    assert!(r.dead_at.is_none());
    assert_eq!(calls, 1, "not retried before its execute_at");
}

/// A worker of the doomed queue on `clock`, polling every 20 ms, its
/// retries at the table's exact delays (no jitter).
fn doomed_worker(db: &TestDb, calls: &Calls, clock: &Clock) -> RunningWorker {
    let exact = outbox::WorkerConfig {
        retry_jitter_percent: 0,
        ..outbox::WorkerConfig::default()
    };
    RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(exact)
            .handler::<Doomed>(calls.clone())
            .handler::<Marker>(calls.clone())
            .clock(clock.clone())
            .poll_interval(Duration::from_millis(20))
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn exhausted_attempts_make_a_dead_task_that_is_never_claimed_again() {
    let db = TestDb::migrated().await;
    let id = outbox::submit(&mut *db.conn().await, Doomed {})
        .await
        .unwrap();
    let (clock, now) = pinned_clock();
    let calls = Calls::default();
    let mut worker = doomed_worker(&db, &calls, &clock);
    worker.wait_for(TaskEventKind::Failed, 1, WAIT).await;
    let r = row(&db, id).await;
    assert_eq!(
        (r.retry_count, r.execute_at),
        (1, now + chrono::Duration::minutes(1)),
        "{r:?}"
    );

    clock.advance(Duration::from_secs(60));
    worker.wait_for(TaskEventKind::Dead, 1, WAIT).await;
    let r = row(&db, id).await;
    assert_eq!(r.state, "failed", "{r:?}");
    assert_eq!(r.retry_count, 2, "the table has two entries: two attempts");
    assert_eq!(r.dead_at, Some(now + chrono::Duration::minutes(1)));
    assert_eq!(r.last_error.as_deref(), Some("attempt 2 of 2 failed"));

    // A day later the dead task is still not claimed: a marker submitted
    // behind it on the same queue runs, the dead task does not.
    clock.advance(Duration::from_secs(86_400));
    outbox::submit(&mut *db.conn().await, Marker {})
        .await
        .unwrap();
    worker.wait_for(TaskEventKind::Completed, 1, WAIT).await;
    worker.stop().await;
    assert_eq!(
        calls.0.load(Ordering::SeqCst),
        2,
        "the doomed handler ran exactly twice"
    );
    let r = row(&db, id).await;
    assert_eq!(
        (r.state.as_str(), r.claims),
        ("failed", 2),
        "still in the table, never claimed again"
    );
    let in_hot_index: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_all_tasks WHERE state IN ('pending', 'failed') AND dead_at IS NULL AND id = $1",
    )
    .bind(id.0)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        in_hot_index, 0,
        "dead rows fall outside the claimable index's predicate"
    );
}

/// A submit's own attempt budget replaces its type's: one attempt ends
/// dead at the first failure, and four attempts of a type whose table has
/// two delays wait the last delay again before the fourth.
#[tokio::test]
async fn a_submits_own_attempts_replace_its_types_and_repeat_the_last_delay() {
    let db = TestDb::migrated().await;
    let submit = async |attempts: u32| {
        outbox::submit_with(
            &mut *db.conn().await,
            Doomed {},
            outbox::TaskOptions::new().max_attempts(attempts),
        )
        .await
        .unwrap()
    };
    let once = submit(1).await;
    let four = submit(4).await;
    let (clock, now) = pinned_clock();
    let calls = Calls::default();
    let mut worker = doomed_worker(&db, &calls, &clock);
    // Either first: the one-attempt task dead, the other's first failure.
    worker
        .wait_for_all(
            &[(TaskEventKind::Dead, 1), (TaskEventKind::Failed, 1)],
            WAIT,
        )
        .await;
    let r = row(&db, once).await;
    assert_eq!((r.retry_count, r.dead_at), (1, Some(now)), "{r:?}");
    assert_eq!(r.last_error.as_deref(), Some("attempt 1 of 1 failed"));
    // The table's delays, 1m then 10m, then 10m again.
    for (waited, retries) in [(60, 2), (600, 3), (600, 4)] {
        clock.advance(Duration::from_secs(waited));
        let kind = if retries == 4 {
            TaskEventKind::Dead
        } else {
            TaskEventKind::Failed
        };
        worker.wait_for(kind, 1, WAIT).await;
        let r = row(&db, four).await;
        assert_eq!(r.retry_count, retries, "{r:?}");
    }
    worker.stop().await;
    let r = row(&db, four).await;
    assert_eq!(
        r.dead_at,
        Some(now + chrono::Duration::minutes(21)),
        "{r:?}"
    );
    assert_eq!(r.last_error.as_deref(), Some("attempt 4 of 4 failed"));
    assert_eq!(calls.0.load(Ordering::SeqCst), 5);
}

/// An attempt budget outside 1 to 10,000 is refused before anything is
/// written.
#[tokio::test]
async fn a_submits_attempts_out_of_range_are_refused() {
    let db = TestDb::migrated().await;
    for attempts in [0, outbox::MAX_ATTEMPTS_LIMIT + 1, u32::MAX] {
        let refused = outbox::submit_with(
            &mut *db.conn().await,
            Doomed {},
            outbox::TaskOptions::new().max_attempts(attempts),
        )
        .await
        .unwrap_err();
        assert_eq!(
            refused.to_string(),
            format!(
                "invalid task option: max_attempts {attempts} is out of range: use 1 (no retry) to 10000"
            )
        );
    }
    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(written, 0);
}

/// With `dead_retention` set, the maintenance leader deletes dead tasks
/// that died before it, one an operator skipped in its key's line too; a
/// dead task that holds its ordering key stays (its key waits for an
/// operator), and so does one that died since.
#[tokio::test]
async fn dead_tasks_past_their_retention_are_deleted_except_a_keys_dead_head() {
    let db = TestDb::migrated().await;
    let once = || outbox::TaskOptions::new().max_attempts(1);
    let mut conn = db.conn().await;
    let old = outbox::submit_with(&mut conn, Doomed {}, once())
        .await
        .unwrap();
    let recent = outbox::submit_with(&mut conn, Doomed {}, once())
        .await
        .unwrap();
    let head = outbox::submit_with(&mut conn, Doomed {}, once().ordering_key("k"))
        .await
        .unwrap();
    let skipped = outbox::submit_with(&mut conn, Doomed {}, once().ordering_key("k2"))
        .await
        .unwrap();
    drop(conn);
    let calls = Calls::default();
    let build = |config: outbox::WorkerConfig| {
        Worker::builder(db.pool.clone())
            .handler::<Doomed>(calls.clone())
            .handler::<Marker>(calls.clone())
            .config(config)
            .build()
            .unwrap()
    };
    let mut worker = RunningWorker::start(build(outbox::WorkerConfig::default()));
    worker.wait_for(TaskEventKind::Dead, 4, WAIT).await;
    worker.stop().await;
    // An operator's cancel of a dead head skips it: its key goes on.
    let cancelled = outbox::admin::cancel_tasks(&db.pool, &[skipped])
        .await
        .unwrap();
    assert_eq!(cancelled, vec![skipped]);
    sqlx::query(
        "UPDATE outbox_tasks SET dead_at = dead_at - interval '40 days' WHERE id = ANY($1)",
    )
    .bind(vec![old.0, head.0, skipped.0])
    .execute(&db.pool)
    .await
    .unwrap();
    let worker = RunningWorker::start(build(outbox::WorkerConfig {
        dead_retention: Some(Duration::from_secs(30 * 86_400)),
        maintenance_interval: Duration::from_millis(100),
        cleanup_interval: Duration::from_millis(100),
        ..outbox::WorkerConfig::default()
    }));
    outbox_tests::process::wait_until(
        &db.pool,
        &format!(
            "SELECT NOT EXISTS (SELECT 1 FROM outbox_tasks WHERE id = {})",
            old.0
        ),
        Duration::from_secs(60),
    )
    .await;
    worker.stop().await;
    let kept: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_tasks ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(kept, vec![recent.0, head.0]);
}

#[tokio::test]
async fn give_up_makes_the_task_dead_at_once() {
    let (r, now, _) = run_flaky_once(
        Flaky {
            give_up: true,
            snooze_ms: None,
        },
        TaskEventKind::Dead,
    )
    .await;
    assert_eq!(
        (r.state.as_str(), r.retry_count, r.dead_at),
        ("failed", 1, Some(now)),
        "{r:?}"
    );
    assert_eq!(r.last_error.as_deref(), Some("gave up on attempt 1"));
}

/// Tasks that fail together come back spread over their delay's jitter
/// (10% either way by default), not all at one instant.
#[tokio::test]
async fn failures_at_one_instant_are_retried_spread_out() {
    let db = TestDb::migrated().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let task = Flaky {
            give_up: false,
            snooze_ms: None,
        };
        ids.push(outbox::submit(&mut *db.conn().await, task).await.unwrap());
    }
    let (clock, now) = pinned_clock();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Flaky>(Calls::default())
            .clock(clock)
            .build()
            .unwrap(),
    );
    worker.wait_for(TaskEventKind::Failed, 5, WAIT).await;
    worker.stop().await;
    let mut due = std::collections::BTreeSet::new();
    for id in ids {
        let r = row(&db, id).await;
        assert_eq!(r.finished_at, Some(now), "{r:?}");
        assert!(
            r.execute_at >= now + chrono::Duration::seconds(54)
                && r.execute_at <= now + chrono::Duration::seconds(66),
            "{r:?}"
        );
        due.insert(r.execute_at);
    }
    assert!(due.len() > 1, "all five retries due at once: {due:?}");
}

#[tokio::test]
async fn retry_after_snoozes_without_counting_an_attempt() {
    let (r, now, _) = run_flaky_once(
        Flaky {
            give_up: false,
            snooze_ms: Some(90_000),
        },
        TaskEventKind::Snoozed,
    )
    .await;
    assert_eq!(r.state, "pending", "{r:?}");
    assert_eq!((r.retry_count, r.claims), (0, 1), "{r:?}");
    assert_eq!(r.execute_at, now + chrono::Duration::seconds(90));
    assert!(
        r.finished_at.is_none() && r.dead_at.is_none() && r.last_error.is_none(),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_retry_due_soon_runs_at_its_due_time_not_at_the_next_poll() {
    let db = TestDb::migrated().await;
    let id = outbox::submit(
        &mut *db.conn().await,
        Flaky {
            give_up: false,
            snooze_ms: Some(300),
        },
    )
    .await
    .unwrap();
    let calls = Calls::default();
    // No NOTIFY and a poll far longer than the test's wait: only the worker
    // remembering when its own snooze comes due can run the task again.
    let config = outbox::WorkerConfig {
        listen: false,
        poll_interval: Duration::from_secs(600),
        ..outbox::WorkerConfig::default()
    };
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(config)
            .handler::<Flaky>(calls.clone())
            .build()
            .unwrap(),
    );
    worker.wait_for(TaskEventKind::Snoozed, 3, WAIT).await;
    worker.stop().await;
    assert!(calls.0.load(Ordering::SeqCst) >= 3);
    assert_eq!(
        row(&db, id).await.retry_count,
        0,
        "snoozes count no attempt"
    );
}
