//! Ordering keys with in-process workers: one task of a key at a time, in
//! commit order; a failing head delays only its key; a dead head blocks
//! only its key until an operator skips it, unless its type skips.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, TaskOptions, Worker,
    WorkerConfig, admin, outbox_task,
};
use outbox_tests::process::wait_until;
use outbox_tests::tasks::{
    IntervalRecorder, Step, assert_one_at_a_time, create_intervals_table, max_overlap,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

pub(crate) fn step(key: &str, n: i64, ms: u64) -> Step {
    Step::new(key, n, ms)
}

fn worker(pool: &sqlx::PgPool, concurrency: usize) -> RunningWorker {
    RunningWorker::start(
        Worker::builder(pool.clone())
            .config(WorkerConfig {
                poll_interval: Duration::from_millis(200),
                ..WorkerConfig::default()
            })
            .handler::<Step>(IntervalRecorder)
            .queue("ordered", concurrency)
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn tasks_of_one_key_run_one_at_a_time_in_order_and_keys_in_parallel() {
    let db = TestDb::migrated().await;
    create_intervals_table(&db.pool).await;
    // Submitted interleaved, in many transactions.
    for n in 1..=8 {
        let mut tx = db.pool.begin().await.unwrap();
        for k in 0..8 {
            outbox::submit(&mut tx, step(&format!("k{k}"), n, 15))
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }
    // Two workers on separate pools: two machines.
    let other = TestDb::pool_on(&db.url, 10).await;
    let a = worker(&db.pool, 8);
    let b = worker(&other, 8);
    wait_until(
        &db.pool,
        "SELECT count(*) = 64 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(60),
    )
    .await;
    a.stop().await;
    b.stop().await;
    let by_key = assert_one_at_a_time(&db.pool).await;
    assert_eq!(by_key.len(), 8);
    for (key, ns) in &by_key {
        assert_eq!(ns, &(1..=8).collect::<Vec<_>>(), "key {key}");
    }
    assert!(
        max_overlap(&db.pool).await > 1,
        "different keys ran in parallel"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks WHERE blocked")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn a_failing_head_delays_its_key_and_no_other() {
    let db = TestDb::migrated().await;
    create_intervals_table(&db.pool).await;
    let mut conn = db.conn().await;
    let mut failing = step("a", 1, 5);
    failing.fail_first = 2;
    outbox::submit(&mut conn, failing).await.unwrap();
    for n in 2..=4 {
        outbox::submit(&mut conn, step("a", n, 5)).await.unwrap();
    }
    for n in 1..=4 {
        outbox::submit(&mut conn, step("b", n, 5)).await.unwrap();
    }
    drop(conn);
    let w = worker(&db.pool, 4);
    wait_until(
        &db.pool,
        "SELECT count(*) = 8 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(30),
    )
    .await;
    w.stop().await;
    let by_key = assert_one_at_a_time(&db.pool).await;
    assert_eq!(by_key[0], ("a".to_owned(), vec![1, 1, 1, 2, 3, 4]));
    assert_eq!(by_key[1], ("b".to_owned(), vec![1, 2, 3, 4]));
    // Key b did not wait for a's retries (300 ms each).
    let (b_done, a_second): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as(
            "SELECT (SELECT max(finished_at) FROM intervals WHERE key = 'b'), \
                    (SELECT min(started_at) FROM intervals WHERE key = 'a' AND n = 2)",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        b_done < a_second,
        "b finished at {b_done}, a's 2nd step started at {a_second}"
    );
}

#[tokio::test]
async fn a_dead_head_blocks_only_its_key_until_an_operator_skips_it() {
    let db = TestDb::migrated().await;
    create_intervals_table(&db.pool).await;
    let mut conn = db.conn().await;
    let mut poison = step("a", 1, 1);
    poison.poison = true;
    let head = outbox::submit(&mut conn, poison).await.unwrap();
    let second = outbox::submit(&mut conn, step("a", 2, 1)).await.unwrap();
    outbox::submit(&mut conn, step("a", 3, 1)).await.unwrap();
    for n in 1..=3 {
        outbox::submit(&mut conn, step("b", n, 1)).await.unwrap();
    }
    drop(conn);
    let w = worker(&db.pool, 4);
    wait_until(
        &db.pool,
        "SELECT count(*) = 3 FROM outbox_all_tasks WHERE state = 'completed' AND ordering_key = 'b'",
        Duration::from_secs(30),
    )
    .await;
    wait_until(
        &db.pool,
        &format!(
            "SELECT dead_at IS NOT NULL FROM outbox_all_tasks WHERE id = {}",
            head.0
        ),
        Duration::from_secs(30),
    )
    .await;
    // Behind the dead head: waiting, never attempted.
    let waiting: Vec<(bool, Option<chrono::DateTime<chrono::Utc>>)> = sqlx::query_as(
        "SELECT blocked, attempted_at FROM outbox_all_tasks WHERE ordering_key = 'a' AND id <> $1",
    )
    .bind(head.0)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(waiting, vec![(true, None), (true, None)]);
    let why = admin::explain_task(&db.pool, second)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&why.reasons[0], admin::Reason::BehindKey { holder: Some(h), holder_state: Some(s), .. }
            if *h == head.0 && s == "dead"),
        "{:?}",
        why.reasons
    );
    let why = admin::explain_task(&db.pool, head).await.unwrap().unwrap();
    assert!(
        matches!(&why.reasons[0], admin::Reason::Dead { blocking: Some(2), error: Some(e), .. } if e == "poison step"),
        "{:?}",
        why.reasons
    );
    let record = admin::get_task(&db.pool, head).await.unwrap().unwrap();
    assert!(!record.skip_dead, "it holds its key");
    // The operator skips it (a cancel of a dead task with a key).
    assert_eq!(
        admin::cancel_tasks(&db.pool, &[head]).await.unwrap(),
        vec![head]
    );
    let record = admin::get_task(&db.pool, head).await.unwrap().unwrap();
    assert!(
        record.state == "dead" && record.skip_dead,
        "skipped, it says so: {record:?}"
    );
    wait_until(
        &db.pool,
        "SELECT count(*) = 2 FROM outbox_all_tasks WHERE state = 'completed' AND ordering_key = 'a'",
        Duration::from_secs(30),
    )
    .await;
    w.stop().await;
    let by_key = assert_one_at_a_time(&db.pool).await;
    assert_eq!(by_key[0], ("a".to_owned(), vec![1, 2, 3]));
    let still_dead: bool =
        sqlx::query_scalar("SELECT dead_at IS NOT NULL FROM outbox_all_tasks WHERE id = $1")
            .bind(head.0)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(still_dead, "skipping keeps the dead task as the record");
}

/// An operator's skip (a cancel of a dead head) lets the key go on for
/// that death only: retried, the task is its type's again, and dying again
/// it holds its key like any dead head of a type that does not skip.
#[tokio::test]
async fn a_skipped_dead_head_that_is_retried_holds_its_key_when_it_dies_again() {
    let db = TestDb::migrated().await;
    create_intervals_table(&db.pool).await;
    let mut poison = step("a", 1, 1);
    poison.poison = true;
    let head = outbox::submit(&mut *db.conn().await, poison).await.unwrap();
    let w = worker(&db.pool, 2);
    let dead = format!(
        "SELECT dead_at IS NOT NULL FROM outbox_all_tasks WHERE id = {}",
        head.0
    );
    wait_until(&db.pool, &dead, Duration::from_secs(30)).await;
    admin::cancel_tasks(&db.pool, &[head]).await.unwrap();
    let claims: i32 = sqlx::query_scalar("SELECT claims FROM outbox_tasks WHERE id = $1")
        .bind(head.0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        admin::retry_tasks(&db.pool, &[head]).await.unwrap(),
        vec![head]
    );
    wait_until(
        &db.pool,
        &format!(
            "SELECT dead_at IS NOT NULL AND claims > {claims} FROM outbox_tasks WHERE id = {}",
            head.0
        ),
        Duration::from_secs(30),
    )
    .await;
    // Dead again: the key waits for an operator once more.
    let next = outbox::submit(&mut *db.conn().await, step("a", 2, 1))
        .await
        .unwrap();
    let blocked: bool = sqlx::query_scalar("SELECT blocked FROM outbox_tasks WHERE id = $1")
        .bind(next.0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        blocked,
        "the next task of the key waits behind the dead head"
    );
    w.stop().await;
}

/// A type whose dead tasks let their key go on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(
    task_type = "test.ordering.skippy",
    queue = "skippy",
    ordering_key = "account",
    on_dead = "skip"
)]
struct Skippy {
    account: u32,
    n: i64,
}

#[derive(Clone, Default)]
struct SkippyRan(Arc<Mutex<Vec<i64>>>);

impl TaskHandler<Skippy> for SkippyRan {
    async fn handle(&self, _ctx: TaskContext, task: Skippy) -> HandlerResult {
        self.0.lock().unwrap().push(task.n);
        if task.n == 1 {
            return Ok(Outcome::GiveUp("first one fails".to_owned()));
        }
        Ok(Outcome::Success)
    }
}

#[tokio::test]
async fn a_type_that_skips_dead_tasks_goes_on_without_an_operator() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    for n in 1..=3 {
        outbox::submit(&mut conn, Skippy { account: 7, n })
            .await
            .unwrap();
    }
    let key: String = sqlx::query_scalar("SELECT DISTINCT ordering_key FROM outbox_all_tasks")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(key, "7", "the macro's ordering_key reads the payload field");
    drop(conn);
    let ran = SkippyRan::default();
    let mut w = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Skippy>(ran.clone())
            .build()
            .unwrap(),
    );
    w.wait_for(TaskEventKind::Completed, 2, Duration::from_secs(30))
        .await;
    w.stop().await;
    assert_eq!(*ran.0.lock().unwrap(), vec![1, 2, 3]);
}

#[tokio::test]
async fn concurrent_submitters_on_one_key_are_handled_in_commit_order() {
    let db = TestDb::migrated().await;
    create_intervals_table(&db.pool).await;
    let submitters = TestDb::pool_on(&db.url, 16).await;
    let committed: Arc<Mutex<Vec<i64>>> = Arc::default();
    let mut handles = Vec::new();
    for n in 0..14_i64 {
        let pool = submitters.clone();
        let committed = Arc::clone(&committed);
        handles.push(tokio::spawn(async move {
            // Begin in one order, submit and commit in others.
            tokio::time::sleep(Duration::from_millis(((n * 7) % 5 * 6) as u64)).await;
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
            tokio::time::sleep(Duration::from_millis(((n * 11) % 7 * 5) as u64)).await;
            outbox::submit(&mut tx, step("one", n, 1)).await.unwrap();
            // Holding the key's lock: the next submitter of the key waits.
            tokio::time::sleep(Duration::from_millis(10 + ((n * 3) % 4 * 5) as u64)).await;
            if n % 5 == 4 {
                tx.rollback().await.unwrap();
            } else {
                tx.commit().await.unwrap();
                committed.lock().unwrap().push(n);
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let committed = committed.lock().unwrap().clone();
    assert_eq!(committed.len(), 12);
    let w = worker(&db.pool, 8);
    wait_until(
        &db.pool,
        "SELECT count(*) = 12 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(30),
    )
    .await;
    w.stop().await;
    let by_key = assert_one_at_a_time(&db.pool).await;
    assert_eq!(by_key, vec![("one".to_owned(), committed.clone())]);
    let by_seq: Vec<i64> =
        sqlx::query_scalar("SELECT (payload->>'n')::bigint FROM outbox_all_tasks ORDER BY key_seq")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(by_seq, committed, "key_seq is the commit order");
}

#[tokio::test]
async fn bad_ordering_keys_are_refused_before_anything_is_written() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    for bad in [String::new(), "x".repeat(513), "nul\0".to_owned()] {
        let err = outbox::submit_with(
            &mut conn,
            step("ignored", 1, 1),
            TaskOptions::new().ordering_key(bad.clone()),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("ordering key"), "{bad:?}: {err}");
    }
    assert_eq!(db.task_count().await, 0);
}

#[tokio::test]
async fn operators_change_many_tasks_of_one_key_in_one_statement() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    let mut ids = Vec::new();
    for n in 1..=5 {
        ids.push(outbox::submit(&mut conn, step("bulk", n, 1)).await.unwrap());
    }
    let blocked = |db: &TestDb| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT blocked FROM outbox_all_tasks WHERE ordering_key = 'bulk' AND dead_at IS NULL ORDER BY key_seq",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(blocked(&db).await, vec![false, true, true, true, true]);
    // The head and the next one cancelled together: the third holds the key.
    admin::cancel_tasks(&db.pool, &ids[..2]).await.unwrap();
    assert_eq!(blocked(&db).await, vec![false, true, true]);
    // Both retried together: they queue behind the holder, in key order.
    admin::retry_tasks(&db.pool, &ids[..2]).await.unwrap();
    let order: Vec<(i64, bool)> = sqlx::query_as(
        "SELECT (payload->>'n')::bigint, blocked FROM outbox_all_tasks ORDER BY key_seq",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        order,
        vec![(1, true), (2, true), (3, false), (4, true), (5, true)]
    );
    // Deleting every task of the key at once is no error either.
    sqlx::query("DELETE FROM outbox_tasks WHERE ordering_key = 'bulk'")
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(db.task_count().await, 0);
}

#[tokio::test]
async fn maintenance_hands_on_a_key_whose_holder_finished_behind_the_engines_back() {
    let db = TestDb::migrated().await;
    create_intervals_table(&db.pool).await;
    let mut conn = db.conn().await;
    let head = outbox::submit(&mut conn, step("manual", 1, 1))
        .await
        .unwrap();
    outbox::submit(&mut conn, step("manual", 2, 1))
        .await
        .unwrap();
    drop(conn);
    // Finished by hand, not through the engine: nothing hands the key on.
    sqlx::query("UPDATE outbox_tasks SET state = 'completed', finished_at = now() WHERE id = $1")
        .bind(head.0)
        .execute(&db.pool)
        .await
        .unwrap();
    let w = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(WorkerConfig {
                maintenance_interval: Duration::from_millis(100),
                cleanup_interval: Duration::from_millis(200),
                ..WorkerConfig::default()
            })
            .handler::<Step>(IntervalRecorder)
            .queue("ordered", 2)
            .build()
            .unwrap(),
    );
    wait_until(
        &db.pool,
        "SELECT count(*) = 2 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(30),
    )
    .await;
    w.stop().await;
}

#[tokio::test]
async fn per_key_concurrency_lets_that_many_of_a_key_run_and_raising_it_hands_out_places() {
    let db = TestDb::migrated().await;
    create_intervals_table(&db.pool).await;
    let mut conn = db.conn().await;
    for n in 1..=6 {
        outbox::submit(&mut conn, step("wide", n, 150))
            .await
            .unwrap();
    }
    drop(conn);
    let waiting = |db: &TestDb| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox_all_tasks WHERE blocked")
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(waiting(&db).await, 5, "one place per key by default");
    let change = admin::QueueChange {
        per_key_concurrency: Some(2),
        ..admin::QueueChange::default()
    };
    admin::set_queue(&db.pool, "ordered", &change)
        .await
        .unwrap();
    assert_eq!(
        waiting(&db).await,
        4,
        "raising it hands out the new place at once"
    );
    // Lowering it takes back a place not started; a running task keeps its
    // place and counts against the setting.
    let set = |n: i32| {
        let pool = db.pool.clone();
        async move {
            admin::set_queue(
                &pool,
                "ordered",
                &admin::QueueChange::new().per_key_concurrency(n),
            )
            .await
            .unwrap();
        }
    };
    set(1).await;
    assert_eq!(waiting(&db).await, 5, "lowering it takes the place back");
    set(2).await;
    assert_eq!(waiting(&db).await, 4);
    sqlx::query(
        "UPDATE outbox_tasks SET state = 'processing', claimed_by = 'test', claims = 1 \
         WHERE id = (SELECT max(id) FROM outbox_tasks WHERE NOT blocked)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    set(1).await;
    let unblocked: Vec<(String, bool)> = sqlx::query_as(
        "SELECT state::text, blocked FROM outbox_tasks WHERE NOT blocked ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        unblocked,
        [("processing".to_owned(), false)],
        "the running one holds the key"
    );
    sqlx::query(
        "UPDATE outbox_tasks SET state = 'pending', claimed_by = NULL, claims = 0 \
         WHERE claimed_by = 'test'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    set(2).await;
    assert_eq!(waiting(&db).await, 4);
    let w = worker(&db.pool, 8);
    wait_until(
        &db.pool,
        "SELECT count(*) = 6 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(30),
    )
    .await;
    w.stop().await;
    assert_eq!(
        max_overlap(&db.pool).await,
        2,
        "two of the key at once, never three"
    );
    // Places are handed out in key order: no task was claimed before an
    // earlier one of its key (those claimed together start together).
    let claimed: Vec<(i64, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT (payload->>'n')::bigint, attempted_at FROM outbox_all_tasks ORDER BY key_seq",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    for pair in claimed.windows(2) {
        assert!(pair[0].1 <= pair[1].1, "{claimed:?}");
    }
}

#[tokio::test]
async fn a_keyed_submit_outside_read_committed_is_refused_and_writes_nothing() {
    let db = TestDb::migrated().await;
    let step = |n| Step::new("acct-rr", n, 0);
    for (level, set) in [
        (
            "REPEATABLE READ",
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        ),
        (
            "SERIALIZABLE",
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        ),
    ] {
        let mut conn = db.conn().await;
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        sqlx::query(set).execute(&mut *tx).await.unwrap();
        let error = outbox::submit(&mut tx, step(1))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("ordering key") && error.contains(&level.to_lowercase()),
            "{level}: {error}"
        );
        tx.rollback().await.unwrap();
        // A task without a key is fine at any isolation.
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        sqlx::query(set).execute(&mut *tx).await.unwrap();
        outbox::submit(&mut tx, outbox_tests::tasks::Record { ms: 0 })
            .await
            .unwrap_or_else(|e| panic!("{level}, no key: {e}"));
        tx.rollback().await.unwrap();
    }
    assert_eq!(db.task_count().await, 0);
    let mut conn = db.conn().await;
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    outbox::submit(&mut tx, step(3)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        db.task_count().await,
        1,
        "READ COMMITTED, the default, is accepted"
    );
}
