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
