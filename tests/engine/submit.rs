//! Submitting in the caller's transaction.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, TaskId, TaskOptions, Worker,
    outbox_task,
};
use outbox_tests::{RunningWorker, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgListener;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[outbox_task(task_type = "test.submit.greet", queue = "submit-tests")]
struct Greet {
    name: String,
    times: u32,
}

/// Records every call: task id -> payloads received.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<HashMap<TaskId, Vec<Greet>>>>);

impl TaskHandler<Greet> for Recorder {
    async fn handle(&self, ctx: TaskContext, task: Greet) -> HandlerResult {
        self.0
            .lock()
            .unwrap()
            .entry(ctx.id())
            .or_default()
            .push(task);
        Ok(Outcome::Success)
    }
}

#[tokio::test]
async fn rollback_leaves_no_task() {
    let db = TestDb::migrated().await;
    let mut tx = db.pool.begin().await.unwrap();
    outbox::submit(
        &mut tx,
        Greet {
            name: "ghost".into(),
            times: 1,
        },
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.task_count().await, 0);
}

#[tokio::test]
async fn commit_runs_the_handler_once_with_the_decoded_payload() {
    let db = TestDb::migrated().await;
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("CREATE TABLE orders (id int)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let sent = Greet {
        name: "Ada".into(),
        times: 3,
    };
    let id = outbox::submit(&mut tx, sent.clone()).await.unwrap();
    tx.commit().await.unwrap();

    let recorder = Recorder::default();
    let mut worker = RunningWorker::start(
        Worker::builder(db.pool.clone())
            .handler::<Greet>(recorder.clone())
            .build()
            .unwrap(),
    );
    let events = worker
        .wait_for(TaskEventKind::Completed, 1, Duration::from_secs(20))
        .await;
    worker.stop().await;

    assert_eq!(events.last().unwrap().id, id);
    let calls = recorder.0.lock().unwrap().clone();
    assert_eq!(
        calls,
        HashMap::from([(id, vec![sent])]),
        "exactly one call with the decoded payload"
    );
    let (state, claims): (String, i32) =
        sqlx::query_as("SELECT state::text, claims FROM outbox_all_tasks WHERE id = $1")
            .bind(id.0)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), claims), ("completed", 1));
}

#[tokio::test]
async fn a_batch_of_1000_goes_in_one_transaction() {
    let db = TestDb::migrated().await;
    let mut tx = db.pool.begin().await.unwrap();
    let tasks = (0..1000).map(|i| Greet {
        name: format!("n{i}"),
        times: i,
    });
    let ids = outbox::submit_batch(&mut tx, tasks).await.unwrap();
    assert_eq!(ids.len(), 1000);
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids come back in submission order"
    );
    // Not visible outside the transaction before commit.
    assert_eq!(db.task_count().await, 0);
    tx.commit().await.unwrap();
    assert_eq!(db.task_count().await, 1000);
    let (first, last): (String, String) = sqlx::query_as(
        "SELECT (SELECT payload->>'name' FROM outbox_all_tasks WHERE id = $1), \
                (SELECT payload->>'name' FROM outbox_all_tasks WHERE id = $2)",
    )
    .bind(ids[0].0)
    .bind(ids[999].0)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((first.as_str(), last.as_str()), ("n0", "n999"));
}

#[tokio::test]
async fn options_set_queue_priority_and_delay() {
    let db = TestDb::migrated().await;
    let id = outbox::submit_with(
        &mut *db.conn().await,
        Greet {
            name: "later".into(),
            times: 1,
        },
        TaskOptions::new()
            .queue("elsewhere")
            .priority(7)
            .delay(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    let (queue, priority, delay_s): (String, i16, f64) = sqlx::query_as(
        "SELECT queue, priority, extract(epoch FROM execute_at - created_at)::float8 FROM outbox_all_tasks WHERE id = $1",
    )
    .bind(id.0)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((queue.as_str(), priority), ("elsewhere", 7));
    assert!(
        (delay_s - 3600.0).abs() < 1e-6,
        "delay measured on the database clock: {delay_s}"
    );
}

#[tokio::test]
async fn a_bad_option_is_an_error_before_anything_is_written() {
    let db = TestDb::migrated().await;
    let mut tx = db.pool.begin().await.unwrap();
    let err = outbox::submit_with(
        &mut tx,
        Greet {
            name: "x".into(),
            times: 1,
        },
        TaskOptions::new().priority(12),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, outbox::Error::InvalidOption(_)), "{err:?}");
    assert!(
        err.to_string().contains("priority 12 is out of range"),
        "{err}"
    );
    // The transaction is still usable: nothing was sent to the database.
    sqlx::query("SELECT 1")
        .execute(&mut *tx)
        .await
        .expect("transaction still healthy");
    tx.commit().await.unwrap();
    assert_eq!(db.task_count().await, 0);
}

#[derive(Serialize, Deserialize)]
#[outbox_task(task_type = "test.submit.unserialisable", queue = "submit-tests-unser")]
struct Unserialisable {
    by_pair: HashMap<(u8, u8), String>,
}

#[tokio::test]
async fn an_unserialisable_payload_is_a_clear_error_and_writes_nothing() {
    let db = TestDb::migrated().await;
    let task = Unserialisable {
        by_pair: HashMap::from([((1, 2), "x".into())]),
    };
    let err = outbox::submit(&mut *db.conn().await, task)
        .await
        .unwrap_err();
    assert!(matches!(err, outbox::Error::Serialize { .. }), "{err:?}");
    assert!(
        err.to_string().contains("test.submit.unserialisable"),
        "{err}"
    );
    assert_eq!(db.task_count().await, 0);
}

#[tokio::test]
async fn notify_is_delivered_only_at_commit() {
    let db = TestDb::migrated().await;
    let mut listener = PgListener::connect_with(&db.pool).await.unwrap();
    listener.listen("outbox_tasks").await.unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    // A queue of this test's own: each process NOTIFYs a queue at most once
    // per few milliseconds, and other tests submit to submit-tests.
    let own_queue = || TaskOptions::new().queue("notify-at-commit");
    outbox::submit_with(
        &mut tx,
        Greet {
            name: "a".into(),
            times: 1,
        },
        own_queue(),
    )
    .await
    .unwrap();
    outbox::submit_with(
        &mut tx,
        Greet {
            name: "b".into(),
            times: 1,
        },
        own_queue(),
    )
    .await
    .unwrap();
    let early = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(early.is_err(), "no notification before commit: {early:?}");
    tx.commit().await.unwrap();

    let n = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (n.channel(), n.payload()),
        ("outbox_tasks", "notify-at-commit")
    );
    // Both submits notified the same queue: PostgreSQL folds them into one.
    let again = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(
        again.is_err(),
        "one notification per queue and transaction: {again:?}"
    );
}

#[tokio::test]
async fn a_task_id_binds_and_decodes_as_a_bigint() {
    let db = TestDb::migrated().await;
    let mut batch = outbox::Batch::new();
    batch
        .push_json(
            outbox::registered_tasks()[0],
            &serde_json::json!({}),
            outbox::TaskOptions::new(),
        )
        .unwrap();
    let ids = batch.submit(&mut *db.conn().await).await.unwrap();
    let found: outbox::TaskId =
        outbox::sqlx::query_scalar("SELECT id FROM outbox_all_tasks WHERE id = $1")
            .bind(ids[0])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(found, ids[0]);
    let all: Vec<outbox::TaskId> = outbox::sqlx::query_scalar(
        "SELECT id FROM outbox_all_tasks WHERE id = ANY($1) ORDER BY id",
    )
    .bind(&ids)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(all, ids);
}

#[tokio::test]
async fn a_single_submit_writes_the_same_row_whichever_statement_carries_it() {
    let db = TestDb::migrated().await;
    let greet = Greet {
        name: "row".into(),
        times: 2,
    };
    // Due now on a queue this process never notified: the batch statement
    // with its NOTIFY. Not due (delayed): the single-row statement, which
    // has no NOTIFY.
    let due_queue = format!("single-due-{}", std::process::id());
    let cases = [
        TaskOptions::new()
            .queue(due_queue.clone())
            .priority(3)
            .ordering_key("acct-1"),
        TaskOptions::new()
            .queue("single-later")
            .priority(3)
            .ordering_key("acct-1")
            .delay(Duration::from_secs(3600)),
        TaskOptions::new()
            .queue("single-later")
            .priority(3)
            .ordering_key("acct-1")
            .delay(Duration::from_secs(3600)),
    ];
    let mut listener = PgListener::connect_with(&db.pool).await.unwrap();
    listener.listen("outbox_tasks").await.unwrap();
    let mut ids = Vec::new();
    for options in cases {
        let mut conn = db.conn().await;
        ids.push(
            outbox::submit_with(&mut conn, greet.clone(), options)
                .await
                .unwrap(),
        );
    }
    let notified = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("the due submit notified")
        .unwrap();
    assert_eq!(notified.payload(), due_queue);
    type Row = (
        String,
        String,
        i16,
        i32,
        Option<String>,
        bool,
        bool,
        f64,
        serde_json::Value,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT task_type, state::text, priority, max_attempts, ordering_key, key_seq IS NOT NULL, \
         blocked, extract(epoch FROM execute_at - created_at)::float8, payload \
         FROM outbox_all_tasks WHERE id = ANY($1) ORDER BY id",
    )
    .bind(ids.iter().map(|i| i.0).collect::<Vec<_>>())
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let payload = serde_json::json!({"name": "row", "times": 2});
    let (due, later, behind) = (&rows[0], &rows[1], &rows[2]);
    for row in &rows {
        assert_eq!(
            (&row.0[..], &row.1[..], row.2, &row.4, row.5, &row.8),
            (
                "test.submit.greet",
                "pending",
                3,
                &Some("acct-1".to_owned()),
                true,
                &payload
            ),
            "{row:?}"
        );
        assert_eq!(row.3, due.3, "the same max_attempts");
    }
    assert!(due.7.abs() < 1.0, "due at once: {due:?}");
    assert!((later.7 - 3600.0).abs() < 1.0, "an hour later: {later:?}");
    assert!(!due.6 && !later.6, "heads of their queues' key run");
    assert!(behind.6, "waits behind the task before it of its key");
}
