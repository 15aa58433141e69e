//! The intake (migration 31): a single submit of a task due now, with no
//! ordering key, writes a narrow row that claims move into `outbox_tasks`.
//! Every way of finding or changing a task by id finds it there at once,
//! and every task in it runs once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::admin::{self, QueueChange, QueueDeletion, TaskFilter};
use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, TaskId, Worker, outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};

const QUEUE: &str = "intake-tests";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.intake.job", queue = "intake-tests")]
struct Job {
    n: u32,
}

/// How many times each task ran.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<TaskId, u32>>>);

impl TaskHandler<Job> for Runs {
    async fn handle(&self, ctx: TaskContext, _task: Job) -> HandlerResult {
        *self.0.lock().unwrap().entry(ctx.id()).or_default() += 1;
        Ok(Outcome::Success)
    }
}

impl Runs {
    fn worker(&self, db: &TestDb) -> RunningWorker {
        RunningWorker::start(
            Worker::builder(db.pool.clone())
                .handler::<Job>(self.clone())
                .build()
                .unwrap(),
        )
    }

    /// The tasks that ran, each with how many times.
    fn ran(&self) -> HashMap<TaskId, u32> {
        self.0.lock().unwrap().clone()
    }
}

async fn in_intake(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_intake")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_task_in_the_intake_is_found_and_changed_by_id_at_once() {
    let db = TestDb::migrated().await;
    let mut conn = db.conn().await;
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(outbox::submit(&mut conn, Job { n }).await.unwrap());
    }
    let [cancelled, signalled, plain] = ids[..] else {
        unreachable!()
    };
    assert_eq!(in_intake(&db).await, 3, "written to the intake");

    let row = admin::get_task(&db.pool, cancelled).await.unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.queue.as_str()), ("pending", QUEUE));
    let filter = TaskFilter {
        queue: Some(QUEUE.to_owned()),
        ..TaskFilter::default()
    };
    let page = admin::search_tasks(&db.pool, &filter).await.unwrap();
    assert_eq!(page.tasks.len(), 3, "{page:?}");
    assert_eq!(admin::queue_health(&db.pool).await.unwrap().claimable, 3);
    let overview = admin::overview(&db.pool).await.unwrap();
    assert!(
        format!("{overview:?}").contains(QUEUE),
        "the queue is in the overview: {overview:?}"
    );

    // The queue is not deleted from under its tasks.
    admin::set_queue(&db.pool, QUEUE, &QueueChange::new().rate_per_second(1000.0))
        .await
        .unwrap();
    assert_eq!(
        admin::delete_queue(&db.pool, QUEUE).await.unwrap(),
        QueueDeletion::Unfinished
    );

    assert_eq!(
        admin::cancel_tasks(&db.pool, &[cancelled]).await.unwrap(),
        [cancelled]
    );
    let row = admin::get_task(&db.pool, cancelled).await.unwrap().unwrap();
    assert_eq!(row.state, "dead", "{row:?}");

    assert!(
        outbox::signal(&mut conn, signalled, "go", &1)
            .await
            .unwrap()
    );
    // A task signalled in the transaction that submitted it.
    let mut tx = db.pool.begin().await.unwrap();
    let same_tx = outbox::submit(&mut tx, Job { n: 9 }).await.unwrap();
    assert!(outbox::signal(&mut tx, same_tx, "go", &2).await.unwrap());
    tx.commit().await.unwrap();
    let signals: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_task_signals WHERE task_id = ANY($1)")
            .bind(vec![signalled.0, same_tx.0])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(signals, 2);

    let runs = Runs::default();
    let mut worker = runs.worker(&db);
    worker
        .wait_for(TaskEventKind::Completed, 3, Duration::from_secs(30))
        .await;
    worker.stop().await;
    assert_eq!(
        runs.ran(),
        HashMap::from([(signalled, 1), (plain, 1), (same_tx, 1)])
    );
    assert_eq!(in_intake(&db).await, 0);
}

/// Submitters writing while two workers claim (each claim moving the
/// intake first, passing over what the other is moving), a tenth of them
/// rolled back: every committed task runs once, none rolled back does.
#[tokio::test]
async fn concurrent_claims_move_each_committed_task_once() {
    let db = TestDb::migrated().await;
    let runs = Runs::default();
    let workers = [runs.worker(&db), runs.worker(&db)];
    let mut submitters = Vec::new();
    for s in 0..4_u32 {
        let pool = db.pool.clone();
        submitters.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            for i in 0..100_u32 {
                let mut tx = pool.begin().await.unwrap();
                let id = outbox::submit(&mut tx, Job { n: s * 1000 + i })
                    .await
                    .unwrap();
                if i % 10 == 3 {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                    committed.push(id);
                }
            }
            committed
        }));
    }
    let mut committed = Vec::new();
    for s in submitters {
        committed.extend(s.await.unwrap());
    }
    assert_eq!(committed.len(), 360);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while runs.ran().len() < committed.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {} ran",
            runs.ran().len(),
            committed.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let [a, b] = workers;
    a.stop().await;
    b.stop().await;
    let ran = runs.ran();
    let expected: HashMap<TaskId, u32> = committed.iter().map(|id| (*id, 1)).collect();
    assert_eq!(ran, expected, "each committed task once, no other");
    assert_eq!(in_intake(&db).await, 0);
}

/// A claim's move of the intake cut off by its session's end (the session
/// terminated before the claim committed) puts nothing anywhere: the tasks
/// stay in the intake, and the next claim moves and runs each once.
#[tokio::test]
async fn a_move_cut_off_by_a_terminated_session_loses_nothing() {
    let db = TestDb::migrated().await;
    let mut ids = Vec::new();
    {
        let mut conn = db.conn().await;
        for n in 0..50 {
            ids.push(outbox::submit(&mut conn, Job { n }).await.unwrap());
        }
    }
    use sqlx::Connection;
    let mut mover = sqlx::PgConnection::connect_with(&db.url.parse().unwrap())
        .await
        .unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut mover)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut mover).await.unwrap();
    let moved: Option<i64> = sqlx::query_scalar("SELECT outbox_take_intake(1000, 0, NULL)")
        .fetch_one(&mut mover)
        .await
        .unwrap();
    assert_eq!(moved, Some(ids[49].0), "all 50 moved");
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(ended);
    assert!(
        sqlx::query("SELECT 1").execute(&mut mover).await.is_err(),
        "the session is gone"
    );
    assert_eq!(in_intake(&db).await, 50, "back in the intake");
    assert_eq!(db.task_count().await, 50, "each once");

    let runs = Runs::default();
    let mut worker = runs.worker(&db);
    worker
        .wait_for(TaskEventKind::Completed, 50, Duration::from_secs(30))
        .await;
    worker.stop().await;
    let expected: HashMap<TaskId, u32> = ids.iter().map(|id| (*id, 1)).collect();
    assert_eq!(runs.ran(), expected);
}

/// Migration 31's down file moves the intake's tasks into `outbox_tasks`
/// before it drops the intake: none is lost.
#[tokio::test]
async fn migrating_down_keeps_the_intakes_tasks() {
    let db = TestDb::migrated().await;
    let id = outbox::submit(&mut *db.conn().await, Job { n: 1 })
        .await
        .unwrap();
    assert_eq!(in_intake(&db).await, 1);
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::raw_sql(include_str!("../../migrations/0031_intake.down.sql"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let state: String = sqlx::query_scalar("SELECT state::text FROM outbox_tasks WHERE id = $1")
        .bind(id.0)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(state, "pending");
    let intake: Option<String> = sqlx::query_scalar("SELECT to_regclass('outbox_intake')::text")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(intake, None);
    tx.rollback().await.unwrap();
}

/// A claim reads the intake above the ids the worker's claims moved (less
/// a margin), and from its first row once a second: a task whose submit
/// drew its id long before it committed, far below that floor, is moved
/// by the next such read, with maintenance (the other mover) off.
#[tokio::test]
async fn a_task_committed_long_after_it_drew_its_id_is_still_moved() {
    let db = TestDb::migrated().await;
    let runs = Runs::default();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(outbox::WorkerConfig {
                maintenance: false,
                ..outbox::WorkerConfig::default()
            })
            .handler::<Job>(runs.clone())
            .build()
            .unwrap(),
    );
    let mut late = db.pool.begin().await.unwrap();
    let early_id = outbox::submit(&mut late, Job { n: 0 }).await.unwrap();
    // Many ids later (the floor's margin is 10,000), a task the worker's
    // claims move and run, leaving their floor far above the open one.
    sqlx::query("SELECT setval(pg_get_serial_sequence('outbox_tasks', 'id'), $1)")
        .bind(early_id.0 + 50_000)
        .execute(&db.pool)
        .await
        .unwrap();
    let later_id = outbox::submit(&mut *db.conn().await, Job { n: 1 })
        .await
        .unwrap();
    worker
        .wait_for(TaskEventKind::Completed, 1, Duration::from_secs(30))
        .await;
    late.commit().await.unwrap();
    worker
        .wait_for(TaskEventKind::Completed, 1, Duration::from_secs(30))
        .await;
    worker.stop().await;
    assert_eq!(runs.ran(), HashMap::from([(early_id, 1), (later_id, 1)]));
}

/// A claim of one queue that moves another queue's task wakes that
/// queue's workers at commit: they may have looked while the move held
/// the task, found nothing, and gone to sleep until their next poll (here
/// a minute away).
#[tokio::test]
async fn a_move_wakes_the_workers_of_the_queues_it_moved_tasks_of() {
    let db = TestDb::migrated().await;
    let runs = Runs::default();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .config(outbox::WorkerConfig {
                poll_interval: Duration::from_secs(60),
                maintenance: false,
                ..outbox::WorkerConfig::default()
            })
            .handler::<Job>(runs.clone())
            .build()
            .unwrap(),
    );
    // Once this has run, the worker listens and waits.
    outbox::submit(&mut *db.conn().await, Job { n: 0 })
        .await
        .unwrap();
    worker
        .wait_for(TaskEventKind::Completed, 1, Duration::from_secs(30))
        .await;
    // A task written and moved by another queue's claim, in one
    // transaction: nothing else notifies its queue.
    let mut mover = db.pool.begin().await.unwrap();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_intake (task_type, queue, payload, priority, max_attempts) \
         VALUES ('test.intake.job', $1, '{\"n\": 1}', 0, 3) RETURNING id",
    )
    .bind(QUEUE)
    .fetch_one(&mut *mover)
    .await
    .unwrap();
    let moved: Option<i64> =
        sqlx::query_scalar("SELECT outbox_take_intake(1000, 0, 'another-queue')")
            .fetch_one(&mut *mover)
            .await
            .unwrap();
    assert_eq!(moved, Some(id));
    mover.commit().await.unwrap();
    worker
        .wait_for(TaskEventKind::Completed, 1, Duration::from_secs(30))
        .await;
    worker.stop().await;
    assert_eq!(runs.ran().get(&TaskId(id)), Some(&1));
}

/// A signal sent in a REPEATABLE READ transaction to a task a claim moved
/// out of the intake after the transaction's snapshot is recorded (a move
/// in the signalling transaction would fail it: "could not serialize
/// access due to concurrent delete").
#[tokio::test]
async fn a_signal_at_repeatable_read_reaches_a_task_moved_since_its_snapshot() {
    let db = TestDb::migrated().await;
    let id = outbox::submit(&mut *db.conn().await, Job { n: 1 })
        .await
        .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT count(*) FROM outbox_intake")
        .execute(&mut *tx)
        .await
        .unwrap();
    db.take_intake().await;
    assert!(outbox::signal(&mut tx, id, "go", &1).await.unwrap());
    tx.commit().await.unwrap();
    let signals: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_task_signals WHERE task_id = $1")
            .bind(id.0)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(signals, 1);
}

/// A worker of the version before migration 31 calls the claim functions'
/// old signatures, which move the intake too: a rolling upgrade that
/// migrates first leaves no task behind.
#[tokio::test]
async fn the_claims_old_signatures_move_the_intake_too() {
    let db = TestDb::migrated().await;
    let plain = outbox::submit(&mut *db.conn().await, Job { n: 1 })
        .await
        .unwrap();
    let claimed: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM outbox_claim_tasks($1, 10, 'old-worker', NULL, -1::smallint, NULL, \
         NULL, NULL, NULL, 1)",
    )
    .bind(QUEUE)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(claimed, [plain.0]);
    admin::set_queue(&db.pool, QUEUE, &QueueChange::new().rate_per_second(1000.0))
        .await
        .unwrap();
    let limited = outbox::submit(&mut *db.conn().await, Job { n: 2 })
        .await
        .unwrap();
    let claimed: Vec<Option<i64>> =
        sqlx::query_scalar("SELECT id FROM outbox_claim_limited($1, 10, 'old-worker-2', NULL)")
            .bind(QUEUE)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(claimed, [Some(limited.0)]);
    assert_eq!(in_intake(&db).await, 0);
}
