//! The claim floor: a producer's claims look above the last task it took
//! before they look behind it (so they do not step over what an open
//! snapshot keeps in the claimable index), without holding back a higher
//! priority, and without leaving a task behind the floor for long.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox::outbox_task;
use outbox::{HandlerResult, Outcome, TaskContext, TaskHandler, TaskOptions, Worker, WorkerConfig};
use outbox_tests::process::wait_until;
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

/// A task that takes `ms` to run, or waits for the test's gate.
#[derive(Debug, Serialize, Deserialize)]
#[outbox_task(task_type = "test.claim_floor.work", queue = "claim-floor")]
struct Work {
    label: String,
    ms: u64,
    gated: bool,
}

fn work(label: &str, ms: u64) -> Work {
    Work {
        label: label.to_owned(),
        ms,
        gated: false,
    }
}

/// Runs `Work`: gated ones wait for a permit of the gate.
#[derive(Clone)]
struct Runner(Arc<Semaphore>);

impl TaskHandler<Work> for Runner {
    async fn handle(&self, _ctx: TaskContext, task: Work) -> HandlerResult {
        if task.gated {
            self.0.acquire().await.expect("gate open").forget();
        }
        tokio::time::sleep(Duration::from_millis(task.ms)).await;
        Ok(Outcome::Success)
    }
}

/// A worker of concurrency 2 that claims only what it can start (no
/// claim-ahead buffer), so each claim takes the places just freed, and
/// does not poll within the test. With `listen` off, nothing but a free
/// place makes it claim.
fn start(db: &TestDb, gate: &Arc<Semaphore>, listen: bool) -> RunningWorker {
    start_on(&db.pool, gate, listen)
}

/// [`start`] on `pool`.
fn start_on(pool: &sqlx::PgPool, gate: &Arc<Semaphore>, listen: bool) -> RunningWorker {
    RunningWorker::start(
        Worker::builder(pool.clone())
            .config(WorkerConfig {
                claim_ahead: 0,
                listen,
                poll_interval: Duration::from_secs(3600),
                ..WorkerConfig::default()
            })
            .handler::<Work>(Runner(Arc::clone(gate)))
            .queue("claim-floor", 2)
            .build()
            .unwrap(),
    )
}

/// Submits 600 tasks labelled "backlog" of 25 ms each at `priority`, and
/// starts a worker on them (two places: it stays busy for 7 s or more,
/// every claim full); returns once 20 have run.
async fn start_busy(db: &TestDb, priority: i16) -> RunningWorker {
    let mut batch = outbox::Batch::new();
    for _ in 0..600 {
        batch
            .push_with(&work("backlog", 25), TaskOptions::new().priority(priority))
            .unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    let worker = start(db, &Arc::new(Semaphore::new(0)), true);
    wait_for(db, "count(*) FILTER (WHERE state = 'completed') >= 20").await;
    worker
}

async fn wait_for(db: &TestDb, condition: &str) {
    wait_until(
        &db.pool,
        &format!("SELECT {condition} FROM outbox_all_tasks"),
        Duration::from_secs(60),
    )
    .await;
}

/// Submits a task labelled "behind", due an hour ago: behind every floor
/// the worker can have.
async fn submit_behind(db: &TestDb) {
    outbox::submit_with(
        &mut *db.conn().await,
        work("behind", 0),
        TaskOptions::new().run_at(Utc::now() - chrono::Duration::hours(1)),
    )
    .await
    .unwrap();
}

async fn wait_for_completed(db: &TestDb, label: &str) {
    wait_for(
        db,
        &format!("bool_or(payload->>'label' = '{label}' AND state = 'completed')"),
    )
    .await;
}

async fn attempted_at(db: &TestDb, label: &str) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT attempted_at FROM outbox_all_tasks WHERE payload->>'label' = $1")
        .bind(label)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// How many backlog tasks were claimed after `after` and before `before`.
async fn backlog_claimed_between(db: &TestDb, after: DateTime<Utc>, before: DateTime<Utc>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM outbox_all_tasks WHERE payload->>'label' = 'backlog' \
         AND attempted_at > $1 AND attempted_at < $2",
    )
    .bind(after)
    .bind(before)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_task_due_behind_the_floor_waits_at_most_about_a_second_for_a_busy_worker() {
    let db = TestDb::migrated().await;
    let worker = start_busy(&db, 0).await;
    submit_behind(&db).await;
    wait_for_completed(&db, "behind").await;
    let behind = attempted_at(&db, "behind").await;
    worker.stop().await;
    // Claimed by the first claim from the front, at most a second after the
    // last: far ahead of the backlog's end. Were the floor never renewed
    // from the front, it would wait for the last claim of the backlog.
    let not_before: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_all_tasks WHERE payload->>'label' = 'backlog' \
         AND (attempted_at IS NULL OR attempted_at > $1)",
    )
    .bind(behind)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        not_before >= 100,
        "only {not_before} backlog tasks were not claimed before the task behind the floor"
    );
}

#[tokio::test]
async fn a_higher_priority_goes_first_whatever_the_floor() {
    let db = TestDb::migrated().await;
    let worker = start_busy(&db, 5).await;
    let mut conn = db.conn().await;
    outbox::submit_with(&mut conn, work("urgent", 0), TaskOptions::new().priority(0))
        .await
        .unwrap();
    let committed: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    wait_for_completed(&db, "urgent").await;
    let urgent = attempted_at(&db, "urgent").await;
    worker.stop().await;
    // Only a claim already under way when it committed (at most two tasks,
    // the worker's places) can take backlog tasks before it.
    let before = backlog_claimed_between(&db, committed, urgent).await;
    assert!(
        before <= 2,
        "{before} backlog tasks of a lower priority were claimed before the urgent task"
    );
}

#[tokio::test]
async fn a_claim_with_nothing_above_the_floor_looks_behind_it() {
    let db = TestDb::migrated().await;
    let gate = Arc::new(Semaphore::new(0));
    let mut batch = outbox::Batch::new();
    for label in ["g1", "g2", "g3"] {
        batch
            .push(&Work {
                label: label.to_owned(),
                ms: 0,
                gated: true,
            })
            .unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    // Neither NOTIFY nor poll: a claim that found nothing would leave the
    // task below for an hour.
    let worker = start(&db, &gate, false);
    // g1 and g2 run (held by the gate); the floor is g2.
    wait_for(&db, "count(*) FILTER (WHERE state = 'processing') = 2").await;
    submit_behind(&db).await;
    // A place frees: the claim takes g3, above the floor.
    gate.add_permits(1);
    wait_for(
        &db,
        "bool_or(payload->>'label' = 'g3' AND state = 'processing')",
    )
    .await;
    // Another: nothing is above the floor (now g3), so the same claim reads
    // behind it and takes the task due an hour ago.
    gate.add_permits(1);
    wait_for_completed(&db, "behind").await;
    gate.add_permits(1);
    wait_for(&db, "bool_and(state = 'completed')").await;
    worker.stop().await;
}

/// Five tasks due an hour ago ("before-1", "before-2", "after-1",
/// "after-2", "after-3", in id order), and a slow walk of their queue
/// recorded as having found "after-1" first a moment ago (it took a
/// second: its floor lasts 20 s).
async fn walked_queue() -> TestDb {
    let db = TestDb::migrated().await;
    // All due at one moment an hour ago: the claim order is the ids'.
    let due = Utc::now() - chrono::Duration::hours(1);
    let mut batch = outbox::Batch::new();
    for label in ["before-1", "before-2", "after-1", "after-2", "after-3"] {
        batch
            .push_with(&work(label, 0), TaskOptions::new().run_at(due))
            .unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    sqlx::query(
        "INSERT INTO outbox_claim_fronts (queue, priority, execute_at, id, walk_ms, walked_at) \
         SELECT queue, priority, execute_at, id, 1000, now() FROM outbox_tasks \
         WHERE payload->>'label' = 'after-1'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    db
}

/// When the last "after" task and the first "before" task started.
async fn last_after_first_before(db: &TestDb) -> (DateTime<Utc>, DateTime<Utc>) {
    sqlx::query_as(
        "SELECT max(attempted_at) FILTER (WHERE payload->>'label' LIKE 'after-%'), \
                min(attempted_at) FILTER (WHERE payload->>'label' LIKE 'before-%') \
         FROM outbox_all_tasks",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// A worker that starts after a slow walk of its queue's claimable index
/// (another producer's, recorded by migration 35) begins where that walk
/// found its first task, and reads what lies before it only once that
/// walk's floor lapses: a worker started beside a long-held snapshot does
/// not step over every entry the snapshot keeps at once. The walk recorded
/// here took a second (its floor lasts 20 s) and found "after-1" first;
/// two tasks lie before it, as tasks that became claimable behind a floor
/// do.
#[tokio::test]
async fn a_started_worker_begins_where_the_queues_last_slow_walk_did() {
    let db = walked_queue().await;
    // Not polling: only the walk falling due brings it back for the tasks
    // before the front.
    let worker = start(&db, &Arc::new(Semaphore::new(0)), true);
    wait_for(&db, "bool_and(state = 'completed')").await;
    worker.stop().await;
    let (last_after, first_before) = last_after_first_before(&db).await;
    assert!(
        last_after < first_before,
        "the tasks from the walk's front on were claimed first ({last_after}), those before it \
         after ({first_before})"
    );
}

/// A worker that cannot read its queue's last walk (here, a role without
/// rights on `outbox_claim_fronts`) goes on without that hint: its first
/// claim walks from the start, so the tasks before the recorded front run
/// first, with no wait for that walk's floor to lapse.
#[tokio::test]
async fn a_worker_that_cannot_read_the_last_walk_claims_from_the_start() {
    let db = walked_queue().await;
    let role = db.role_without("outbox_claim_fronts").await;
    let worker = start_on(&role.pool, &Arc::new(Semaphore::new(0)), true);
    wait_for(&db, "bool_and(state = 'completed')").await;
    worker.stop().await;
    role.drop_role().await;
    let (_, first_before) = last_after_first_before(&db).await;
    let first_after: DateTime<Utc> = sqlx::query_scalar(
        "SELECT min(attempted_at) FROM outbox_all_tasks WHERE payload->>'label' LIKE 'after-%'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        first_before < first_after,
        "the tasks before the walk's front were claimed first ({first_before}), those from it \
         after ({first_after})"
    );
}
