//! Unique tasks: a unique index decides, so concurrent submits can never
//! both insert; duplicates write nothing and return the holder's id.

use std::sync::Arc;
use std::time::Duration;

use outbox::{Batch, TaskEventKind, TaskId, TaskOptions, Unique, Worker, admin, outbox_task};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};
use tokio::sync::Barrier;

/// Unique by its order, as the type declares.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.unique.invoice", queue = "unique-tests", unique_by = ["order_id"])]
struct Invoice {
    order_id: i64,
    note: String,
}

/// Unique only when a submit says so.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[outbox_task(task_type = "test.unique.plain", queue = "unique-tests-plain")]
struct Plain {
    n: i64,
}

/// Sends invoices (successfully).
struct Send;

impl outbox::TaskHandler<Invoice> for Send {
    async fn handle(&self, _ctx: outbox::TaskContext, _task: Invoice) -> outbox::HandlerResult {
        Ok(outbox::Outcome::Success)
    }
}

fn invoice(order_id: i64) -> Invoice {
    Invoice {
        order_id,
        note: format!("note {order_id}"),
    }
}

async fn rows_with_key(db: &TestDb, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks WHERE unique_key = $1")
        .bind(key)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicate_submits_from_many_connections_insert_one_row() {
    const CLIENTS: usize = 24;
    let db = TestDb::migrated().await;
    // A connection per client: the barrier is passed with transactions open.
    let pool = TestDb::pool_on(&db.url, CLIENTS as u32).await;
    let start = Arc::new(Barrier::new(CLIENTS));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let pool = pool.clone();
        let start = Arc::clone(&start);
        clients.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            start.wait().await;
            let done = outbox::submit_detailed(&mut tx, invoice(42), TaskOptions::new())
                .await
                .unwrap();
            tx.commit().await.unwrap();
            done
        }));
    }
    let mut results = Vec::new();
    for c in clients {
        results.push(c.await.unwrap());
    }
    let fresh: Vec<_> = results.iter().filter(|r| !r.duplicate).collect();
    assert_eq!(fresh.len(), 1, "exactly one insert: {results:?}");
    assert!(
        results.iter().all(|r| r.id == fresh[0].id),
        "every duplicate names the inserted task: {results:?}"
    );
    assert_eq!(rows_with_key(&db, "test.unique.invoice:[42]").await, 1);
    assert_eq!(db.task_count().await, 1);
}

#[tokio::test]
async fn a_batch_handles_duplicates_within_itself_and_against_the_table() {
    let db = TestDb::migrated().await;
    let held = outbox::submit(&mut *db.conn().await, invoice(2))
        .await
        .unwrap();
    let mut batch = Batch::new();
    batch.push(&invoice(1)).unwrap(); // fresh
    batch.push(&invoice(2)).unwrap(); // held by the table
    batch.push(&invoice(1)).unwrap(); // held by the batch's first task
    batch.push(&Plain { n: 1 }).unwrap(); // not unique
    batch
        .push_with(&Plain { n: 2 }, TaskOptions::new().unique_key("k"))
        .unwrap(); // fresh, by an explicit key
    batch
        .push_with(&Plain { n: 3 }, TaskOptions::new().unique_key("k"))
        .unwrap(); // same explicit key
    batch.push(&Plain { n: 4 }).unwrap(); // not unique
    let done = batch.submit_detailed(&mut *db.conn().await).await.unwrap();
    let dup: Vec<bool> = done.iter().map(|d| d.duplicate).collect();
    assert_eq!(dup, [false, true, true, false, false, true, false]);
    assert_eq!(done[1].id, held);
    assert_eq!(done[2].id, done[0].id);
    assert_eq!(done[5].id, done[4].id);
    assert!(
        done[3].id < done[4].id && done[4].id < done[6].id,
        "{done:?}"
    );
    assert_eq!(db.task_count().await, 5, "one held + four written");
    // Ids match the tasks they name.
    let plain = admin::get_task(&db.pool, done[6].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(plain.payload["n"], 4);
    let keyed = admin::get_task(&db.pool, done[5].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(keyed.payload["n"], 2);
}

#[tokio::test]
async fn a_key_is_free_again_once_its_task_left_the_covered_states() {
    let db = TestDb::migrated().await;
    // Default: pending, processing and retrying are covered; done and dead
    // are not.
    let first = outbox::submit(&mut *db.conn().await, invoice(5))
        .await
        .unwrap();
    let worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Invoice>(Send)
            .build()
            .unwrap(),
    );
    let mut worker = worker;
    worker
        .wait_for(TaskEventKind::Completed, 1, Duration::from_secs(20))
        .await;
    worker.stop().await;
    let second = outbox::submit_detailed(&mut *db.conn().await, invoice(5), TaskOptions::new())
        .await
        .unwrap();
    assert!(
        !second.duplicate && second.id != first,
        "completed is not covered"
    );
    admin::cancel_tasks(&db.pool, &[second.id]).await.unwrap();
    let third = outbox::submit_detailed(&mut *db.conn().await, invoice(5), TaskOptions::new())
        .await
        .unwrap();
    assert!(!third.duplicate, "dead is not covered");
    // An operator retry of the dead task would duplicate the live one: it
    // is left dead.
    assert!(
        admin::retry_tasks(&db.pool, &[second.id])
            .await
            .unwrap()
            .is_empty()
    );
    // And the operator is told which task holds the key.
    assert_eq!(
        admin::why_not_retried(&db.pool, &[second.id, third.id, TaskId(i64::MAX)])
            .await
            .unwrap(),
        [
            (
                second.id,
                format!("its unique key is held by task {}", third.id)
            ),
            (third.id, "due already".to_owned()),
            (TaskId(i64::MAX), "no such task".to_owned()),
        ]
    );
    assert_eq!(
        admin::get_task(&db.pool, second.id)
            .await
            .unwrap()
            .unwrap()
            .state,
        "dead"
    );
    // Two dead tasks of one key (the second submitted after the first
    // died) and one of another key, retried together: the first of the
    // key and the other are retried; the second stays dead.
    admin::cancel_tasks(&db.pool, &[third.id]).await.unwrap();
    let other = outbox::submit(&mut *db.conn().await, invoice(6))
        .await
        .unwrap();
    admin::cancel_tasks(&db.pool, &[other]).await.unwrap();
    let mut retried = admin::retry_dead(&db.pool, Some("test.unique.invoice"))
        .await
        .unwrap();
    retried.sort();
    assert_eq!(retried, [second.id, other]);
    assert_eq!(
        admin::get_task(&db.pool, third.id)
            .await
            .unwrap()
            .unwrap()
            .state,
        "dead"
    );

    // Covering completed and dead tasks too.
    let wide =
        || TaskOptions::new().unique(Unique::key("wide").including_completed().including_dead());
    let a = outbox::submit_detailed(&mut *db.conn().await, Plain { n: 1 }, wide())
        .await
        .unwrap();
    admin::cancel_tasks(&db.pool, &[a.id]).await.unwrap();
    let b = outbox::submit_detailed(&mut *db.conn().await, Plain { n: 2 }, wide())
        .await
        .unwrap();
    assert!(b.duplicate && b.id == a.id, "dead is covered: {b:?}");
}

#[tokio::test]
async fn a_period_allows_one_task_per_period_of_the_database_clock() {
    let db = TestDb::migrated().await;
    let hourly = || TaskOptions::new().unique(Unique::key("report").per(Duration::from_secs(3600)));
    // One transaction, so one reading of the clock: two would fall into
    // different hours across the top of one.
    let mut tx = db.pool.begin().await.unwrap();
    let a = outbox::submit_detailed(&mut tx, Plain { n: 1 }, hourly())
        .await
        .unwrap();
    let b = outbox::submit_detailed(&mut tx, Plain { n: 2 }, hourly())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(!a.duplicate && b.duplicate && b.id == a.id);

    // A 2-second period: once the database clock is in the next period, the
    // same key inserts again (waiting on the clock, not a fixed sleep).
    let short = || TaskOptions::new().unique(Unique::key("tick").per(Duration::from_secs(2)));
    let first = outbox::submit_detailed(&mut *db.conn().await, Plain { n: 3 }, short())
        .await
        .unwrap();
    let key: String = sqlx::query_scalar("SELECT unique_key FROM outbox_all_tasks WHERE id = $1")
        .bind(first.id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let bucket: i64 = key.rsplit(':').next().unwrap().parse().unwrap();
    outbox_tests::process::wait_until(
        &db.pool,
        &format!("SELECT floor(extract(epoch FROM now()) / 2)::bigint > {bucket}"),
        Duration::from_secs(10),
    )
    .await;
    let next = outbox::submit_detailed(&mut *db.conn().await, Plain { n: 4 }, short())
        .await
        .unwrap();
    assert!(
        !next.duplicate && next.id != first.id,
        "a new period: {next:?}"
    );
}

#[tokio::test]
async fn bad_unique_options_are_refused_before_anything_is_written() {
    let db = TestDb::migrated().await;
    let too_long = TaskOptions::new().unique_key("k".repeat(outbox::MAX_UNIQUE_KEY + 1));
    let error = outbox::submit_with(&mut *db.conn().await, Plain { n: 1 }, too_long)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("too long"), "{error}");
    let too_short = TaskOptions::new().unique(Unique::key("k").per(Duration::from_millis(1)));
    assert!(
        outbox::submit_with(&mut *db.conn().await, Plain { n: 1 }, too_short)
            .await
            .is_err()
    );
    assert_eq!(db.task_count().await, 0);
    let _: TaskId = outbox::submit(&mut *db.conn().await, Plain { n: 1 })
        .await
        .unwrap();
}
