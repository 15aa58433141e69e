//! Runs: a claim that takes a key's next task also takes the tasks waiting
//! behind it (`WorkerConfig::key_run`), and the worker runs them one after
//! the other, each once the one before it is done (migration 28).

use std::time::Duration;

use outbox::{Worker, WorkerConfig, WorkerCounters};
use outbox_tests::process::wait_until;
use outbox_tests::tasks::{IntervalRecorder, Step, assert_one_at_a_time, create_intervals_table};
use outbox_tests::{RunningWorker, TestDb};

/// Drains `steps` (submitted in one transaction) with one worker of
/// concurrency 4 whose claims take runs of up to `key_run`; returns its
/// counters. The worker takes no part in maintenance: no recovery, no
/// advance of waiting keys, so every key goes on by the worker's own
/// statements or not at all.
async fn drain(db: &TestDb, steps: &[Step], key_run: usize) -> std::sync::Arc<WorkerCounters> {
    create_intervals_table(&db.pool).await;
    let mut batch = outbox::Batch::new();
    for s in steps {
        batch.push(s).unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    let worker = Worker::builder(db.pool.clone())
        .config(WorkerConfig {
            poll_interval: Duration::from_millis(200),
            key_run,
            maintenance: false,
            ..WorkerConfig::default()
        })
        .handler::<Step>(IntervalRecorder)
        .queue("ordered", 4)
        .build()
        .unwrap();
    let counters = worker.counters();
    let running = RunningWorker::start(worker);
    wait_until(
        &db.pool,
        &format!(
            "SELECT count(*) = {} FROM outbox_all_tasks WHERE state = 'completed'",
            steps.len()
        ),
        Duration::from_secs(60),
    )
    .await;
    running.stop().await;
    counters
}

#[tokio::test]
async fn a_keys_tasks_claimed_in_runs_run_in_order_once_each_and_record_when_each_started() {
    let db = TestDb::migrated().await;
    let steps: Vec<Step> = (1..=20)
        .flat_map(|n| ["r", "s"].map(|key| Step::new(key, n, 2)))
        .collect();
    let counters = drain(&db, &steps, 8).await;
    let by_key = assert_one_at_a_time(&db.pool).await;
    let in_order: Vec<i64> = (1..=20).collect();
    assert_eq!(
        by_key,
        vec![
            ("r".to_owned(), in_order.clone()),
            ("s".to_owned(), in_order)
        ]
    );
    let c = counters.snapshot();
    // Each claim of a key's next step takes up to seven behind it.
    assert!(c.tasks_run_on >= 20, "{c:?}");
    // Claimed once each; none handed its key by the step before it.
    let claimed_again: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks WHERE claims <> 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(claimed_again, 0);
    // The history tells each attempt's start, not its claim's: no step of a
    // key seems to start before the one ahead of it finished, and each
    // started no later than its handler.
    let untruthful: Vec<(String, i64)> = sqlx::query_as(
        "SELECT t.ordering_key, t.key_seq FROM ( \
             SELECT ordering_key, key_seq, id, attempted_at, \
                    lag(finished_at) OVER (PARTITION BY ordering_key ORDER BY key_seq) AS before \
             FROM outbox_all_tasks) AS t \
         JOIN intervals AS i ON i.task_id = t.id \
         WHERE t.attempted_at < t.before OR t.attempted_at > i.started_at",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(untruthful.is_empty(), "{untruthful:?}");
}

#[tokio::test]
async fn a_step_failing_inside_a_run_holds_its_key_and_the_rest_go_back_behind_its_retry() {
    let db = TestDb::migrated().await;
    // Step 3 of "f" fails once: it is in step 1's run, not its head.
    let steps: Vec<Step> = (1..=6)
        .map(|n| {
            let mut s = Step::new("f", n, 2);
            s.fail_first = i32::from(n == 3);
            s
        })
        .collect();
    // Its retry comes 300 ms later, and the key goes on from it.
    let counters = drain(&db, &steps, 8).await;
    let by_key = assert_one_at_a_time(&db.pool).await;
    assert_eq!(by_key, vec![("f".to_owned(), vec![1, 2, 3, 3, 4, 5, 6])]);
    let c = counters.snapshot();
    assert!(c.tasks_run_on >= 2, "steps 2 and 3 ran on in a run: {c:?}");
    let retried: Vec<(i64, i32)> = sqlx::query_as(
        "SELECT key_seq, retry_count FROM outbox_all_tasks WHERE retry_count > 0 ORDER BY key_seq",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        retried.len(),
        1,
        "only step 3 counted an attempt: {retried:?}"
    );
}

#[tokio::test]
async fn a_key_run_of_one_claims_each_task_alone() {
    let db = TestDb::migrated().await;
    let steps: Vec<Step> = (1..=6).map(|n| Step::new("one", n, 2)).collect();
    let counters = drain(&db, &steps, 1).await;
    let by_key = assert_one_at_a_time(&db.pool).await;
    assert_eq!(by_key, vec![("one".to_owned(), (1..=6).collect())]);
    assert_eq!(counters.snapshot().tasks_run_on, 0);
}

const CLAIM: &str = include_str!("../../outbox-core/src/db/sql/claim_tasks.sql");
const COMPLETE: &str = include_str!("../../outbox-core/src/db/sql/complete_tasks.sql");
const RECOVER: &str = include_str!("../../outbox-core/src/db/sql/recover_stuck.sql");
const RELEASE_RUN: &str = include_str!("../../outbox-core/src/db/sql/release_run.sql");

/// Claims key `r`'s head with its run under `token`, as a worker does:
/// (id, claims) in key order.
async fn claim_run(conn: &mut sqlx::PgConnection, token: &str) -> Vec<(i64, i32)> {
    use sqlx::Row;
    let rows = sqlx::query(CLAIM)
        .bind("ordered")
        .bind(1_i64)
        .bind(token)
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(-1_i16)
        .bind(chrono::DateTime::UNIX_EPOCH)
        .bind(0_i64)
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(None::<i64>)
        .bind(8_i32)
        .fetch_all(conn)
        .await
        .unwrap();
    let mut run: Vec<(i64, i64, i32)> = rows
        .iter()
        .map(|r| (r.get("key_seq"), r.get("id"), r.get("claims")))
        .collect();
    run.sort_unstable();
    run.into_iter()
        .map(|(_, id, claims)| (id, claims))
        .collect()
}

/// The outcome of `head` as the worker writes it when its run goes on with
/// `next`: whether the statement says the run ends here.
async fn complete_continuing(
    conn: &mut sqlx::PgConnection,
    head: (i64, i32),
    token: &str,
    next: i64,
) -> bool {
    use sqlx::Row;
    let rows = sqlx::query(COMPLETE)
        .bind(vec![head.0])
        .bind(vec![head.1])
        .bind(vec![token])
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(Vec::<String>::new())
        .bind(Vec::<i32>::new())
        .bind(None::<String>)
        .bind(vec![head.0])
        .bind(vec![None::<chrono::DateTime<chrono::Utc>>])
        .bind(vec![next])
        .fetch_all(conn)
        .await
        .unwrap();
    rows.iter()
        .find(|r| r.get::<Option<i64>, _>("id") == Some(head.0))
        .and_then(|r| r.get::<Option<bool>, _>("run_halted"))
        .expect("the head's outcome written")
}

/// (state, blocked, claimed_by) of each task, in key order.
async fn line(pool: &sqlx::PgPool, ids: &[i64]) -> Vec<(String, bool, Option<String>)> {
    let mut rows = Vec::new();
    for id in ids {
        rows.push(
            sqlx::query_as(
                "SELECT state::text, blocked, claimed_by FROM outbox_all_tasks WHERE id = $1",
            )
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap(),
        );
    }
    rows
}

/// Stuck-task recovery as if the heartbeat timeout had passed.
async fn recover(conn: &mut sqlx::PgConnection) {
    sqlx::query(RECOVER)
        .bind(1_i64)
        .bind(100_i64)
        .bind(Some(chrono::Utc::now() + chrono::Duration::hours(1)))
        .bind(None::<String>)
        .fetch_all(conn)
        .await
        .unwrap();
}

async fn submit_three(db: &TestDb) {
    let mut batch = outbox::Batch::new();
    for n in 1..=3 {
        batch.push(&Step::new("r", n, 0)).unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
}

/// Recovery and a run's outcome racing, each unaware of the other: the
/// outcome keeps the key only for a next task it could lock as still its
/// worker's, and where neither hands the key on, the worker's give-back
/// does; no key is left waiting with nothing holding it.
#[tokio::test]
async fn recovery_racing_a_runs_outcome_leaves_its_key_to_the_first_in_line() {
    let db = TestDb::migrated().await;
    submit_three(&db).await;
    let mut worker = db.conn().await;
    let run = claim_run(&mut worker, "w/1").await;
    assert_eq!(run.len(), 3, "the head and two behind it");
    let ids: Vec<i64> = run.iter().map(|(id, _)| *id).collect();

    // The outcome's transaction has the head locked (its batch) when
    // recovery runs: recovery passes it over and takes the rest of the run
    // back (uncommitted), then the outcome finds the next task taken.
    let mut outcome = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM outbox_tasks WHERE id = $1 FOR UPDATE")
        .bind(ids[0])
        .execute(&mut *outcome)
        .await
        .unwrap();
    let mut recovery = db.pool.begin().await.unwrap();
    recover(&mut recovery).await;
    let ends = complete_continuing(&mut outcome, run[0], "w/1", ids[1]).await;
    assert!(ends, "the run's next task is not the worker's any more");
    outcome.commit().await.unwrap();
    recovery.commit().await.unwrap();
    // Recovery saw the head holding the key; the outcome saw the run's next
    // task as PROCESSING: neither handed the key on. The worker gives the
    // rest of the run back, which does.
    assert_eq!(
        line(&db.pool, &ids[1..]).await,
        vec![
            ("pending".to_owned(), true, None),
            ("pending".to_owned(), true, None)
        ]
    );
    sqlx::query(RELEASE_RUN)
        .bind(ids[1..].to_vec())
        .bind(vec!["w/1"; 2])
        .fetch_all(&mut *worker)
        .await
        .unwrap();
    assert_eq!(
        line(&db.pool, &ids[1..]).await,
        vec![
            ("pending".to_owned(), false, None),
            ("pending".to_owned(), true, None)
        ],
        "the key went to the first in line"
    );
}

#[tokio::test]
async fn a_runs_outcome_that_locks_its_next_task_first_keeps_it_from_recovery() {
    let db = TestDb::migrated().await;
    submit_three(&db).await;
    let mut worker = db.conn().await;
    let run = claim_run(&mut worker, "w/1").await;
    let ids: Vec<i64> = run.iter().map(|(id, _)| *id).collect();
    // The outcome first: it locks the run's next task, so recovery passes
    // over it and the head, and takes back only the last one.
    let mut outcome = db.pool.begin().await.unwrap();
    let ends = complete_continuing(&mut outcome, run[0], "w/1", ids[1]).await;
    assert!(!ends, "the run goes on");
    let mut recovery = db.pool.begin().await.unwrap();
    recover(&mut recovery).await;
    recovery.commit().await.unwrap();
    outcome.commit().await.unwrap();
    let after = line(&db.pool, &ids).await;
    assert_eq!(after[0].0, "completed");
    assert_eq!(
        after[1..],
        [
            ("processing".to_owned(), true, Some("w/1".to_owned())),
            ("pending".to_owned(), true, None)
        ],
        "the next task is still the worker's and holds the key; the last waits behind it"
    );
}
