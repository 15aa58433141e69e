//! Runs: a claim that takes a key's next task also takes the tasks waiting
//! behind it (`WorkerConfig::key_run`), and the worker runs them one after
//! the other, each once the one before it is done (migration 28).

use std::time::Duration;

use outbox::{Worker, WorkerConfig, WorkerCounters};
use outbox_tests::process::wait_until;
use outbox_tests::tasks::{IntervalRecorder, Step, assert_one_at_a_time, create_intervals_table};
use outbox_tests::{RunningWorker, TestDb};

/// A worker whose claims take runs of up to `key_run`, polling every
/// 200 ms. It takes no part in maintenance: no recovery, no advance of
/// waiting keys, so every key goes on by the worker's own statements or not
/// at all.
fn config(key_run: usize) -> WorkerConfig {
    WorkerConfig {
        poll_interval: Duration::from_millis(200),
        key_run,
        maintenance: false,
        ..WorkerConfig::default()
    }
}

/// Drains `steps` (submitted in one transaction) with one worker of
/// concurrency 4 configured by `config`; returns its counters.
async fn drain(
    db: &TestDb,
    steps: &[Step],
    config: WorkerConfig,
) -> std::sync::Arc<WorkerCounters> {
    create_intervals_table(&db.pool).await;
    let mut batch = outbox::Batch::new();
    for s in steps {
        batch.push(s).unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
    let worker = Worker::builder(db.pool.clone())
        .config(config)
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
    // Neither listening nor polling within the test: no claim of the
    // worker's own can take the places an outcome offers (see below).
    let quiet = WorkerConfig {
        listen: false,
        poll_interval: Duration::from_secs(3600),
        ..config(8)
    };
    let counters = drain(&db, &steps, quiet).await;
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
    // The claim takes each key's first step with the seven behind it
    // (1-8), and the last step of each run hands its key straight on to the
    // next run, claimed by its outcome (9-16, then 17-20; migration 46):
    // the worker has idle slots throughout, two keys in four. (An offer
    // finds no place only while a claim of the worker's own holds them: a
    // claim then takes that run, and the worker never claims otherwise.)
    assert_eq!(c.tasks_run_on, 2 * 17, "{c:?}");
    assert!(c.tasks_handed_on >= 2, "most run ends handed on: {c:?}");
    assert!(c.tasks_claimed < 2 * 20, "{c:?}");
    // Claimed once each, in a run or on its own.
    let claimed_again: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks WHERE claims <> 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(claimed_again, 0);
    // The history tells each attempt's start, not its claim's: no step of a
    // key seems to start before the handler of the one ahead of it
    // returned, and each started no later than its own handler.
    let untruthful: Vec<(String, i64)> = sqlx::query_as(
        "SELECT t.ordering_key, t.key_seq FROM ( \
             SELECT a.ordering_key, a.key_seq, a.attempted_at, i.started_at, \
                    lag(i.finished_at) OVER (PARTITION BY a.ordering_key ORDER BY a.key_seq) AS before \
             FROM outbox_all_tasks AS a JOIN intervals AS i ON i.task_id = a.id) AS t \
         WHERE t.attempted_at < t.before OR t.attempted_at > t.started_at",
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
    let counters = drain(&db, &steps, config(8)).await;
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
    let counters = drain(&db, &steps, config(1)).await;
    let by_key = assert_one_at_a_time(&db.pool).await;
    assert_eq!(by_key, vec![("one".to_owned(), (1..=6).collect())]);
    assert_eq!(counters.snapshot().tasks_run_on, 0);
}

pub(crate) const COMPLETE: &str = include_str!("../../outbox-core/src/db/sql/complete_tasks.sql");
/// The success outcome as the worker sends it when it offers places and
/// takes runs (`db::complete_tasks`).
const COMPLETE_HANDING_RUNS: &str = concat!(
    "WITH o AS MATERIALIZED (\n",
    include_str!("../../outbox-core/src/db/sql/complete_tasks.sql"),
    include_str!("../../outbox-core/src/db/sql/hand_on_runs.sql")
);
pub(crate) const RECOVER: &str = include_str!("../../outbox-core/src/db/sql/recover_stuck.sql");
pub(crate) const RELEASE_RUN: &str = include_str!("../../outbox-core/src/db/sql/release_run.sql");

/// Claims key `r`'s head with its run under `token`, as a worker does:
/// (id, claims) in key order.
pub(crate) async fn claim_run(conn: &mut sqlx::PgConnection, token: &str) -> Vec<(i64, i32)> {
    use sqlx::Row;
    let rows = crate::claim_sql::claim(conn, "ordered", 1, token, 8).await;
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
pub(crate) async fn complete_continuing(
    conn: &mut sqlx::PgConnection,
    head: (i64, i32),
    token: &str,
    next: i64,
) -> bool {
    outcome_continuing(conn, head, token, next)
        .await
        .expect("the head's outcome written")
}

/// As complete_continuing: None when the attempt is not written.
pub(crate) async fn outcome_continuing(
    conn: &mut sqlx::PgConnection,
    head: (i64, i32),
    token: &str,
    next: i64,
) -> Option<bool> {
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
}

/// (state, blocked, claimed_by) of each task, in key order.
pub(crate) async fn line(pool: &sqlx::PgPool, ids: &[i64]) -> Vec<(String, bool, Option<String>)> {
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

/// Stuck-task recovery as if the heartbeat timeout had passed, `limit`
/// tasks at most.
pub(crate) async fn recover(conn: &mut sqlx::PgConnection, limit: i64) {
    sqlx::query(RECOVER)
        .bind(1_i64)
        .bind(limit)
        .bind(Some(chrono::Utc::now() + chrono::Duration::hours(1)))
        .bind(None::<String>)
        .fetch_all(conn)
        .await
        .unwrap();
}

/// Submits `n` tasks of key `r`, in one transaction.
pub(crate) async fn submit_run_of(db: &TestDb, n: i64) {
    let mut batch = outbox::Batch::new();
    for n in 1..=n {
        batch.push(&Step::new("r", n, 0)).unwrap();
    }
    batch.submit(&mut *db.conn().await).await.unwrap();
}

/// Stuck-task recovery returns a run's waiting tasks only with every other
/// PROCESSING task of their claim and key: not while the outcome of the
/// run's current task is in flight (it holds that task's row). The tasks
/// held in place between a run's head and its last task (without a write,
/// migration 56) are back in their line once the last is. So an outcome
/// that keeps the key for the
/// run's next task never does so for a task recovery took back, and a
/// whole run that is recovered leaves the key to the first in its line.
#[tokio::test]
async fn recovery_takes_a_run_back_only_whole_and_never_from_under_its_outcome() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 3).await;
    let mut worker = db.conn().await;
    let run = claim_run(&mut worker, "w/1").await;
    assert_eq!(run.len(), 3, "the head and two behind it");
    let ids: Vec<i64> = run.iter().map(|(id, _)| *id).collect();
    let held = || {
        vec![
            ("processing".to_owned(), true, Some("w/1".to_owned())),
            ("processing".to_owned(), true, Some("w/1".to_owned())),
        ]
    };

    // The head's outcome in flight, its row locked: recovery passes over
    // it and takes back nothing of its run.
    let mut outcome = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM outbox_tasks WHERE id = $1 FOR UPDATE")
        .bind(ids[0])
        .execute(&mut *outcome)
        .await
        .unwrap();
    recover(&mut worker, 100).await;
    assert_eq!(line(&db.pool, &ids[1..]).await, held());
    let ends = complete_continuing(&mut outcome, run[0], "w/1", ids[1]).await;
    assert!(!ends, "the run goes on with its next task");
    outcome.commit().await.unwrap();
    assert_eq!(
        line(&db.pool, &ids[1..]).await,
        held(),
        "the key kept for the run"
    );

    // Whole, even under a limit of one task: the run's last task is its
    // only PROCESSING one now, and with it back, the task held in place
    // between them (never written) is a waiting task again. Both in line,
    // without an attempt, the key to the first.
    recover(&mut worker, 1).await;
    assert_eq!(
        line(&db.pool, &ids[1..]).await,
        vec![
            ("pending".to_owned(), false, None),
            ("pending".to_owned(), true, None)
        ],
        "the key went to the first in line"
    );
    let retries: Vec<i32> = sqlx::query_scalar(
        "SELECT retry_count FROM outbox_tasks WHERE id = ANY($1) ORDER BY key_seq",
    )
    .bind(&ids[1..])
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(retries, vec![0, 0]);
    // The worker, late, gives back what it thinks is still its run:
    // nothing changes.
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
        ]
    );
}

/// An attempt of a task held in place without a write (migration 56) is
/// written only while its run's last task carries its claim. The run
/// given back and another claim holding the same tasks with the same
/// claim counts (a release writes nothing on them), the first claim's
/// attempt is refused and changes nothing, and the second claim's is
/// written. Recovery, which takes runs from workers that may still write,
/// counts the run's claim on the tasks it held: a late attempt is refused
/// by its count as well.
#[tokio::test]
async fn a_late_attempt_of_a_task_held_in_place_is_refused_once_another_claim_holds_it() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 5).await;
    let mut worker = db.conn().await;
    let first = claim_run(&mut worker, "w/1").await;
    let ids: Vec<i64> = first.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.len(), 5);
    assert!(
        !complete_continuing(&mut worker, first[0], "w/1", ids[1]).await,
        "the run goes on"
    );
    sqlx::query(RELEASE_RUN)
        .bind(ids[1..].to_vec())
        .bind(vec!["w/1"; 4])
        .fetch_all(&mut *worker)
        .await
        .unwrap();
    let second = claim_run(&mut worker, "w/2").await;
    assert_eq!(
        second,
        vec![(ids[1], 1), (ids[2], 1), (ids[3], 1), (ids[4], 2)],
        "the rest claimed again: the tasks between with the same claim count"
    );
    assert_eq!(first[2], (ids[2], 1));
    let before = versions(&db.pool, &ids[2..3]).await;
    assert_eq!(
        outcome_continuing(&mut worker, first[2], "w/1", ids[3]).await,
        None,
        "the first claim's attempt is not written"
    );
    assert_eq!(
        versions(&db.pool, &ids[2..3]).await,
        before,
        "nor anything of its task"
    );
    assert!(!complete_continuing(&mut worker, second[0], "w/2", ids[2]).await);
    assert!(
        !complete_continuing(&mut worker, second[1], "w/2", ids[3]).await,
        "the second claim's is, and its run goes on"
    );
    // Recovered, the task it still holds counts the claim.
    recover(&mut worker, 100).await;
    let counted: i32 = sqlx::query_scalar("SELECT claims FROM outbox_tasks WHERE id = $1")
        .bind(ids[3])
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(counted, 1);
    assert_eq!(
        outcome_continuing(&mut worker, second[2], "w/2", ids[4]).await,
        None,
        "the second claim's late attempt is not written"
    );
    let history: Vec<(i64, i32)> =
        sqlx::query_as("SELECT id, claims FROM outbox_task_history WHERE id = ANY($1) ORDER BY id")
            .bind(&ids)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(history, vec![(ids[0], 1), (ids[1], 1), (ids[2], 1)]);
    assert_eq!(
        line(&db.pool, &ids[3..]).await,
        vec![
            ("pending".to_owned(), false, None),
            ("pending".to_owned(), true, None)
        ],
        "the key to the task it held"
    );
}

/// The statements of key runs read tasks by primary key whatever the
/// statistics (migration 34). A claim locked its runs' tasks by `t.id =
/// ANY (...) AND t.blocked`, and `blocked` is the whole predicate of the
/// index of tasks waiting for their key; an outcome asked whether a run's
/// next task was still running by `f.id = c.next AND f.state =
/// 'processing'`, the predicate of the index of running tasks. Planned
/// under statistics gathered while no task waited or ran (a table analyzed
/// after a drain), the functions' kept plans read those indexes whole: a
/// claim of 390 runs took 2.4 s, an outcome of 232 runs 234 ms, and a
/// bench drain over 1,000 keys ran at 0.05-0.1x the unordered drain in two
/// runs of three. Counted in the calling transactions' own statistics, so
/// nothing depends on timing.
#[tokio::test]
async fn a_runs_claim_and_outcome_read_by_primary_key_under_stale_statistics() {
    const KEYS: i64 = 40;
    const PER_KEY: i64 = 301;
    const RUN: i64 = 16;
    let db = TestDb::migrated().await;
    // Statistics that say no task waits for a key or runs, kept while the
    // test runs.
    outbox_tests::tasks::stale_task_statistics(&db.pool, "ordered").await;
    let mut batch = outbox::Batch::new();
    for n in 1..=PER_KEY {
        for key in 0..KEYS {
            batch.push(&Step::new(&format!("k{key}"), n, 0)).unwrap();
        }
    }
    batch.submit(&mut *db.conn().await).await.unwrap();

    // A session of its own, so the functions are planned under these
    // statistics.
    let mut conn = TestDb::pool_on(&db.url, 1).await.acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    let before = outbox_tests::tasks::task_index_fetches(&mut conn).await;
    let claimed: Vec<(String, i64, i64, i32)> = sqlx::query_as(
        "SELECT ordering_key, key_seq, id, claims FROM outbox_claim_tasks('ordered', $1, 'runs', \
         NULL, -1::smallint, 'epoch', 0, NULL, NULL, $2, NULL, true)",
    )
    .bind(KEYS)
    .bind(RUN as i32)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let claim_fetched = outbox_tests::tasks::task_index_fetches(&mut conn).await - before;
    sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
    assert_eq!(
        claimed.len() as i64,
        KEYS * RUN,
        "every key's head came with a full run"
    );
    let waiting = KEYS * (PER_KEY - 1);
    assert!(
        claim_fetched < waiting / 2,
        "a claim of {KEYS} runs of {RUN} fetched {claim_fetched} rows through indexes with \
         {waiting} tasks waiting for their keys"
    );

    // One run's first task done, its run going on: the other runs' tasks
    // are all PROCESSING.
    let mut run: Vec<_> = claimed.iter().filter(|c| c.0 == "k0").collect();
    run.sort_by_key(|c| c.1);
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    // Counted from here: the counts of earlier transactions of the session
    // may not have been flushed yet.
    let before = outbox_tests::tasks::task_index_fetches(&mut conn).await;
    let halted = complete_continuing(&mut conn, (run[0].2, run[0].3), "runs", run[1].2).await;
    let outcome_fetched = outbox_tests::tasks::task_index_fetches(&mut conn).await - before;
    sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
    assert!(!halted, "the run goes on");
    let running = KEYS * RUN;
    assert!(
        outcome_fetched < running / 4,
        "one run's outcome fetched {outcome_fetched} rows through indexes with {running} tasks \
         running"
    );
}

pub(crate) const HEARTBEAT: &str = include_str!("../../outbox-core/src/db/sql/heartbeat.sql");
const RELEASE_CLAIMS: &str = include_str!("../../outbox-core/src/db/sql/release_claims.sql");

/// (state, blocked, claimed_by, heartbeat set, cancel asked) of each task
/// as the table holds it, in key order.
pub(crate) async fn rows(
    pool: &sqlx::PgPool,
    ids: &[i64],
) -> Vec<(String, bool, Option<String>, bool, bool)> {
    sqlx::query_as(
        "SELECT state::text, blocked, claimed_by, heartbeat_at IS NOT NULL, \
                cancel_requested_at IS NOT NULL \
         FROM outbox_tasks WHERE id = ANY($1) ORDER BY key_seq",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The row versions of tasks `ids`, in key order: a write or a row lock
/// changes a row's (xmin, xmax).
pub(crate) async fn versions(pool: &sqlx::PgPool, ids: &[i64]) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT xmin::text, xmax::text FROM outbox_tasks WHERE id = ANY($1) ORDER BY key_seq",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A run's head and last task are claimed PROCESSING; the tasks between
/// them are held in place without a write (migration 56): PENDING,
/// blocked and unclaimed as they were, their run's last task saying where
/// the run starts; shown as running under the run's claim. The heartbeat
/// confirms them by their run's last task, an operator's cancel marks one
/// as it marks a running task, and a worker's release at shutdown leaves
/// them in line behind the rest of their run, the cancelled one dead.
#[tokio::test]
async fn a_runs_middle_tasks_are_held_in_place_and_go_back_with_their_run() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 4).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_tasks ORDER BY key_seq")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let before = versions(&db.pool, &ids).await;
    let mut worker = db.conn().await;
    let run = claim_run(&mut worker, "w/1").await;
    assert_eq!(
        run.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        ids,
        "the head and three behind it"
    );
    assert_eq!(
        run.iter().map(|(_, claims)| *claims).collect::<Vec<_>>(),
        vec![1; 4],
        "each with the claim its attempt counts"
    );
    let after = versions(&db.pool, &ids).await;
    assert_eq!(
        after[1..3],
        before[1..3],
        "the two between neither written nor locked"
    );
    assert_ne!(after[0], before[0]);
    assert_ne!(after[3], before[3]);
    let claimed = |state: &str, blocked, heartbeat, cancel| {
        (
            state.to_owned(),
            blocked,
            Some("w/1".to_owned()),
            heartbeat,
            cancel,
        )
    };
    let unwritten = |cancel| ("pending".to_owned(), true, None, false, cancel);
    assert_eq!(
        rows(&db.pool, &ids).await,
        vec![
            claimed("processing", false, true, false),
            unwritten(false),
            unwritten(false),
            claimed("processing", true, true, false),
        ]
    );
    let shown: Vec<(String, Option<String>, i32)> = sqlx::query_as(
        "SELECT state::text, claimed_by, claims FROM outbox_all_tasks WHERE id = ANY($1) \
         ORDER BY key_seq",
    )
    .bind(&ids)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        shown,
        vec![("processing".to_owned(), Some("w/1".to_owned()), 1); 4],
        "all four shown as running under the run's claim"
    );
    // Counted as running, not as waiting for their key, by the gauges, the
    // overview and `tasks explain`.
    let health = outbox::admin::queue_health(&db.pool).await.unwrap();
    assert_eq!((health.processing, health.blocked), (4, 0));
    let overview = outbox::admin::overview(&db.pool).await.unwrap();
    let ordered = overview
        .queues
        .iter()
        .find(|q| q.queue == "ordered")
        .unwrap();
    assert_eq!((ordered.processing, ordered.blocked), (4, 0));
    let explained = outbox::admin::explain_task(&db.pool, outbox::TaskId(ids[1]))
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            explained.reasons.as_slice(),
            [outbox::admin::Reason::Running { worker: Some(w), in_run: true, .. }] if w == "w/1"
        ),
        "{:?}",
        explained.reasons
    );

    // The heartbeat confirms all four and writes only the two running.
    let confirmed: Vec<i64> = sqlx::query_scalar(HEARTBEAT)
        .bind(&ids)
        .bind(vec!["w/1"])
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .fetch_all(&mut *worker)
        .await
        .unwrap();
    let mut confirmed = confirmed;
    confirmed.sort_unstable();
    let mut all = ids.clone();
    all.sort_unstable();
    assert_eq!(confirmed, all, "every task of the run is still held");
    assert_eq!(rows(&db.pool, &ids).await[1], unwritten(false));
    assert_eq!(versions(&db.pool, &ids).await[1..3], before[1..3]);
    // Under another claim, nothing of it is confirmed but nothing is lost
    // either: the heartbeat of a worker that lost the run.
    let other: Vec<i64> = sqlx::query_scalar(HEARTBEAT)
        .bind(&ids)
        .bind(vec!["w/2"])
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .fetch_all(&mut *worker)
        .await
        .unwrap();
    assert_eq!(other, Vec::<i64>::new());

    // An operator's cancel of a held task marks it; it is not dead yet.
    let asked = outbox::admin::cancel_tasks(&db.pool, &[outbox::TaskId(ids[1])])
        .await
        .unwrap();
    assert_eq!(asked, vec![outbox::TaskId(ids[1])]);
    assert_eq!(rows(&db.pool, &ids).await[1], unwritten(true));

    // Shutdown: the worker gives back everything held under its token.
    sqlx::query(RELEASE_CLAIMS)
        .bind(vec!["w/1"])
        .bind(None::<Vec<i64>>)
        .fetch_all(&mut *worker)
        .await
        .unwrap();
    let back: Vec<(String, bool, Option<String>, bool)> = sqlx::query_as(
        "SELECT state::text, blocked, claimed_by, dead_at IS NOT NULL \
         FROM outbox_tasks WHERE id = ANY($1) ORDER BY key_seq",
    )
    .bind(&ids)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        back,
        vec![
            ("pending".to_owned(), false, None, false),
            ("failed".to_owned(), false, None, true),
            ("pending".to_owned(), true, None, false),
            ("pending".to_owned(), true, None, false),
        ],
        "the head holds its key again, the cancelled one is dead, the rest wait"
    );
}

/// A build before migration 56 claims through the claim's previous
/// signature, and its heartbeat confirms a run's held tasks by the claim on
/// them: its runs are held as migration 43 held them (under the claim),
/// and the statements of this build confirm, complete and show them as
/// they did, so both builds can run on one schema during an upgrade.
#[tokio::test]
async fn a_run_claimed_as_builds_before_migration_56_claim_is_held_under_its_claim() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 4).await;
    let mut worker = db.conn().await;
    let mut run: Vec<(i64, i64, i32)> = sqlx::query_as(
        "SELECT key_seq, id, claims FROM outbox_claim_tasks('ordered', 1, 'old/1', NULL, \
         -1::smallint, 'epoch', 0, NULL, NULL, 8, NULL)",
    )
    .fetch_all(&mut *worker)
    .await
    .unwrap();
    run.sort_unstable();
    let ids: Vec<i64> = run.iter().map(|r| r.1).collect();
    assert_eq!(ids.len(), 4);
    let claimed = |state: &str, blocked, heartbeat| {
        (
            state.to_owned(),
            blocked,
            Some("old/1".to_owned()),
            heartbeat,
            false,
        )
    };
    assert_eq!(
        rows(&db.pool, &ids).await,
        vec![
            claimed("processing", false, true),
            claimed("pending", true, false),
            claimed("pending", true, false),
            claimed("processing", true, true),
        ]
    );
    let mut confirmed: Vec<i64> = sqlx::query_scalar(HEARTBEAT)
        .bind(&ids)
        .bind(vec!["old/1"])
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .fetch_all(&mut *worker)
        .await
        .unwrap();
    confirmed.sort_unstable();
    let mut all = ids.clone();
    all.sort_unstable();
    assert_eq!(confirmed, all);
    for step in 0..3 {
        assert!(
            !complete_continuing(
                &mut worker,
                (ids[step], run[step].2),
                "old/1",
                ids[step + 1]
            )
            .await,
            "step {step} written, the run going on"
        );
    }
    let history: Vec<i32> = sqlx::query_scalar(
        "SELECT claims FROM outbox_task_history WHERE id = ANY($1) ORDER BY key_seq",
    )
    .bind(&ids)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(history, vec![1, 1, 1]);
}

/// A run given back (release_run.sql: a failure, say) or recovered leaves
/// the tasks it held without a write in their line as they were, and makes
/// one an operator asked to cancel meanwhile dead; the key goes to the
/// first task left.
#[tokio::test]
async fn a_run_given_back_or_recovered_leaves_its_held_tasks_in_line_and_a_cancelled_one_dead() {
    for recovered in [false, true] {
        let db = TestDb::migrated().await;
        submit_run_of(&db, 5).await;
        let mut worker = db.conn().await;
        let run = claim_run(&mut worker, "w/1").await;
        let ids: Vec<i64> = run.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids.len(), 5);
        let asked = outbox::admin::cancel_tasks(&db.pool, &[outbox::TaskId(ids[2])])
            .await
            .unwrap();
        assert_eq!(asked, vec![outbox::TaskId(ids[2])], "marked, not dead yet");
        assert!(!complete_continuing(&mut worker, run[0], "w/1", ids[1]).await);
        if recovered {
            recover(&mut worker, 100).await;
        } else {
            sqlx::query(RELEASE_RUN)
                .bind(ids[1..].to_vec())
                .bind(vec!["w/1"; 4])
                .fetch_all(&mut *worker)
                .await
                .unwrap();
        }
        let back: Vec<(String, bool, Option<String>, bool)> = sqlx::query_as(
            "SELECT state::text, blocked, claimed_by, dead_at IS NOT NULL \
             FROM outbox_tasks WHERE id = ANY($1) ORDER BY key_seq",
        )
        .bind(&ids[1..])
        .fetch_all(&db.pool)
        .await
        .unwrap();
        assert_eq!(
            back,
            vec![
                ("pending".to_owned(), false, None, false),
                ("failed".to_owned(), false, None, true),
                ("pending".to_owned(), true, None, false),
                ("pending".to_owned(), true, None, false),
            ],
            "recovered: {recovered}"
        );
    }
}

/// Raising a queue's per-key concurrency during a run hands the new place
/// to the first task in line that is not claimed, never to one held in
/// place (which would then be claimable while its run goes on).
#[tokio::test]
async fn a_place_handed_out_during_a_run_skips_its_held_tasks() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 10).await;
    let mut worker = db.conn().await;
    let run = claim_run(&mut worker, "w/1").await;
    assert_eq!(run.len(), 8, "the head and a run of 8 in all");
    outbox::admin::set_queue(
        &db.pool,
        "ordered",
        // The head and the run's last task hold two places: a third is free.
        &outbox::admin::QueueChange::new().per_key_concurrency(3),
    )
    .await
    .unwrap();
    let line: Vec<(i64, String, bool, Option<String>)> = sqlx::query_as(
        "SELECT (payload->>'n')::bigint, state::text, blocked, claimed_by \
         FROM outbox_tasks ORDER BY key_seq",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let held: Vec<_> = line[1..7]
        .iter()
        .map(|(_, state, blocked, by)| (state.as_str(), *blocked, by.as_deref()))
        .collect();
    // Held in place without a write (migration 56): waiting in line as
    // they were, behind the head, before the run's last task.
    assert_eq!(held, vec![("pending", true, None); 6], "{line:?}");
    assert_eq!(
        (line[8].0, line[8].2, line[8].3.is_none()),
        (9, false, true),
        "the ninth has the new place: {line:?}"
    );
    assert_eq!((line[9].0, line[9].2), (10, true), "{line:?}");
}

/// An outcome that hands a key on claims the key's next task with the run
/// behind it (migration 46), as a claim does: the run's last task
/// PROCESSING, those between held in place, and the run stops before the
/// first task that could not be claimed on its own (here one not due
/// yet).
#[tokio::test]
async fn an_outcome_hands_its_key_on_to_the_next_run() {
    use sqlx::Row;
    let db = TestDb::migrated().await;
    submit_run_of(&db, 6).await;
    let ids: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM outbox_tasks WHERE ordering_key = 'r' ORDER BY key_seq")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    sqlx::query("UPDATE outbox_tasks SET execute_at = now() + interval '1 hour' WHERE id = $1")
        .bind(ids[4])
        .execute(&db.pool)
        .await
        .unwrap();
    let mut worker = db.conn().await;
    // The head alone, then its success with an offer of one place.
    let claimed = crate::claim_sql::claim(&mut worker, "ordered", 1, "w/1", 1).await;
    assert_eq!(claimed.len(), 1);
    let mut handed: Vec<(i64, Option<bool>, Option<i64>)> = sqlx::query(COMPLETE_HANDING_RUNS)
        .bind(vec![ids[0]])
        .bind(vec![1_i32])
        .bind(vec!["w/1"])
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(vec!["ordered"])
        .bind(vec![1_i32])
        .bind(Some("w/hand"))
        .bind(Vec::<i64>::new())
        .bind(None::<Vec<Option<chrono::DateTime<chrono::Utc>>>>)
        .bind(Vec::<i64>::new())
        .bind(Some(8_i32))
        .fetch_all(&mut *worker)
        .await
        .unwrap()
        .iter()
        .filter(|r| r.get::<bool, _>("handed"))
        .map(|r| {
            (
                r.get::<i64, _>("id"),
                r.get::<Option<bool>, _>("claimed"),
                r.get::<Option<i64>, _>("run_of"),
            )
        })
        .collect();
    handed.sort_unstable();
    assert_eq!(
        handed,
        vec![
            (ids[1], Some(true), None),
            (ids[2], Some(true), Some(ids[1])),
            (ids[3], Some(true), Some(ids[1])),
        ],
        "the next task, and the run behind it up to the task not due"
    );
    let hand = Some("w/hand".to_owned());
    let (processing, pending) = ("processing".to_owned(), "pending".to_owned());
    assert_eq!(
        rows(&db.pool, &ids[1..]).await,
        vec![
            (processing.clone(), false, hand.clone(), true, false),
            // Held in place without a write (migration 56).
            (pending.clone(), true, None, false, false),
            (processing.clone(), true, hand.clone(), true, false),
            (pending.clone(), true, None, false, false),
            (pending.clone(), true, None, false, false),
        ]
    );
    assert_eq!(
        line(&db.pool, &ids[1..]).await,
        vec![
            (processing.clone(), false, hand.clone()),
            (processing.clone(), true, hand.clone()),
            (processing.clone(), true, hand.clone()),
            (pending.clone(), true, None),
            (pending.clone(), true, None),
        ],
        "shown as the run's: the one between under its claim, the two after it waiting"
    );
}

const RELEASE_ORPHANS: &str = include_str!("../../outbox-core/src/db/sql/release_orphan_holds.sql");

/// The maintenance leader's look for held tasks nothing will run, as if
/// the heartbeat timeout had passed: the ids it gave back.
async fn release_orphans(pool: &sqlx::PgPool) -> Vec<i64> {
    let mut ids: Vec<i64> = sqlx::query_scalar(RELEASE_ORPHANS)
        .bind(Some(chrono::Utc::now() + chrono::Duration::hours(1)))
        .bind(None::<String>)
        .bind(100_i64)
        .bind(1_i64)
        .fetch_all(pool)
        .await
        .unwrap();
    ids.sort_unstable();
    ids
}

/// Tasks held in place for a run whose running tasks ended without them
/// (a worker built before migration 43 let its run's running tasks go and
/// knew nothing of the held ones: a rolling upgrade left them PENDING under
/// its claim for ever, while later tasks of their key ran) go back to their
/// key's line once their worker is gone, and the key to the first of them
/// when nothing holds it. A live run, or a dead worker's run that still has
/// its running task (stuck-task recovery's), is left alone.
#[tokio::test]
async fn tasks_held_for_a_run_that_ended_without_them_go_back_once_their_worker_is_gone() {
    let db = TestDb::migrated().await;
    submit_run_of(&db, 4).await;
    let mut worker = db.conn().await;
    let run = claim_run(&mut worker, "w/1").await;
    let ids: Vec<i64> = run.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.len(), 4);
    // Held as migration 43 held them, under the claim: a run claimed
    // before migration 56 (which leaves them unwritten).
    sqlx::query(
        "UPDATE outbox_tasks SET claimed_by = 'w/1', claims = claims + 1, run_from = NULL \
         WHERE id = ANY($1)",
    )
    .bind(vec![ids[1], ids[2], ids[3]])
    .execute(&db.pool)
    .await
    .unwrap();

    // Its worker gone, its run whole: stuck-task recovery's, not this.
    assert!(release_orphans(&db.pool).await.is_empty());

    // The run's running tasks end without the held ones, as the old
    // heartbeat's let-go and a new worker's claim made them end.
    sqlx::query("UPDATE outbox_tasks SET claimed_by = 'other/9' WHERE id = ANY($1)")
        .bind(vec![ids[0], ids[3]])
        .execute(&db.pool)
        .await
        .unwrap();
    // While worker w is alive, its holds are its own.
    sqlx::query(
        "INSERT INTO outbox_workers (id, host, pid, queues, expires_at) \
         VALUES ('w', 'h', 1, '[]', now() + interval '2 hours')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    assert!(release_orphans(&db.pool).await.is_empty());
    sqlx::query("DELETE FROM outbox_workers WHERE id = 'w'")
        .execute(&db.pool)
        .await
        .unwrap();

    // Gone: the two held tasks go back to the line, unclaimed, without an
    // attempt; the key stays with the running tasks that hold it.
    assert_eq!(release_orphans(&db.pool).await, vec![ids[1], ids[2]]);
    assert_eq!(
        line(&db.pool, &ids).await,
        vec![
            ("processing".to_owned(), false, Some("other/9".to_owned())),
            ("pending".to_owned(), true, None),
            ("pending".to_owned(), true, None),
            ("processing".to_owned(), true, Some("other/9".to_owned())),
        ]
    );
    let attempts: Vec<i32> =
        sqlx::query_scalar("SELECT retry_count FROM outbox_tasks WHERE id = ANY($1)")
            .bind(vec![ids[1], ids[2]])
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(attempts, vec![0, 0]);
    assert!(release_orphans(&db.pool).await.is_empty(), "once");
}
