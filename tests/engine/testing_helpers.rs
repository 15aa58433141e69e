//! The test helpers applications get with the `testing` feature.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outbox::testing;
use outbox::{
    HandlerError, HandlerResult, Outcome, TaskContext, TaskEventKind, TaskHandler, Worker,
    outbox_task,
};
use outbox_tests::TestDb;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[outbox_task(task_type = "test.helpers.invoice", queue = "helpers")]
struct SendInvoice {
    invoice: i64,
    fail: bool,
}

#[derive(Clone, Default)]
struct Mailer(Arc<AtomicUsize>);

impl TaskHandler<SendInvoice> for Mailer {
    async fn handle(&self, _ctx: TaskContext, task: SendInvoice) -> HandlerResult {
        self.0.fetch_add(1, Ordering::SeqCst);
        if task.fail {
            Err(HandlerError::msg("mail server down"))
        } else {
            Ok(Outcome::Success)
        }
    }
}

#[tokio::test]
async fn assert_submitted_sees_the_open_transaction_and_nothing_leaks_before_commit() {
    let db = TestDb::migrated().await;
    let mut tx = db.pool.begin().await.unwrap();
    let expected = SendInvoice {
        invoice: 7,
        fail: false,
    };
    let id = outbox::submit(&mut tx, expected.clone()).await.unwrap();
    assert_eq!(testing::assert_submitted(&mut tx, &expected).await, id);
    testing::assert_none_submitted::<SendInvoice>(&mut *db.conn().await).await;
    let listed = testing::submitted::<SendInvoice>(&mut tx).await;
    assert_eq!(listed, vec![(id, expected)]);
}

fn invoice(n: i64) -> SendInvoice {
    SendInvoice {
        invoice: n,
        fail: false,
    }
}

/// The task helpers in a transaction count its own tasks only (as the
/// event helpers do), in the intake or the task table, in a savepoint or
/// not: a task another transaction committed made `assert_submitted` pass
/// for a transaction that submitted nothing.
#[tokio::test]
async fn the_task_helpers_in_a_transaction_count_only_its_own_tasks() {
    let db = TestDb::migrated().await;
    // Committed elsewhere: a single submit (the intake) and a batch (the
    // task table).
    let mut other = db.pool.begin().await.unwrap();
    let mut committed = vec![outbox::submit(&mut other, invoice(1)).await.unwrap()];
    committed.extend(
        outbox::submit_batch(&mut other, [invoice(2), invoice(3)])
            .await
            .unwrap(),
    );
    other.commit().await.unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    testing::assert_none_submitted::<SendInvoice>(&mut tx).await;
    let single = outbox::submit(&mut tx, invoice(4)).await.unwrap();
    // Committed by a transaction that began after this one had its id: a
    // later id, which only the in-progress check tells from this one's.
    let later = outbox::submit(&mut *db.conn().await, invoice(8))
        .await
        .unwrap();
    committed.push(later);
    let mut savepoint = sqlx::Connection::begin(&mut *tx).await.unwrap();
    let batch = outbox::submit_batch(&mut savepoint, [invoice(5), invoice(6)])
        .await
        .unwrap();
    savepoint.commit().await.unwrap();
    let mut undone = sqlx::Connection::begin(&mut *tx).await.unwrap();
    outbox::submit(&mut undone, invoice(7)).await.unwrap();
    undone.rollback().await.unwrap();

    assert_eq!(
        testing::submitted::<SendInvoice>(&mut tx).await,
        vec![
            (single, invoice(4)),
            (batch[0], invoice(5)),
            (batch[1], invoice(6))
        ]
    );
    assert_eq!(
        testing::assert_submitted(&mut tx, &invoice(5)).await,
        batch[0]
    );
    // Outside a transaction: every task of the type, committed ones only.
    let everything = testing::submitted::<SendInvoice>(&mut *db.conn().await).await;
    assert_eq!(
        everything.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        committed
    );
    tx.commit().await.unwrap();
    let everything = testing::submitted::<SendInvoice>(&mut *db.conn().await).await;
    assert_eq!(everything.len(), 7);
}

#[tokio::test]
#[should_panic(expected = "no \"test.helpers.invoice\" task equal to")]
async fn assert_submitted_says_what_was_submitted_instead() {
    let db = TestDb::migrated().await;
    let mut tx = db.pool.begin().await.unwrap();
    outbox::submit(
        &mut tx,
        SendInvoice {
            invoice: 1,
            fail: false,
        },
    )
    .await
    .unwrap();
    testing::assert_submitted(
        &mut tx,
        &SendInvoice {
            invoice: 2,
            fail: false,
        },
    )
    .await;
}

#[tokio::test]
async fn run_inline_calls_the_handler_with_the_decoded_payload_and_writes_nothing() {
    let db = TestDb::migrated().await;
    let id = outbox::submit(
        &mut *db.conn().await,
        SendInvoice {
            invoice: 3,
            fail: false,
        },
    )
    .await
    .unwrap();
    let mailer = Mailer::default();
    assert_eq!(
        testing::run_inline(&db.pool, id, &mailer).await.unwrap(),
        Outcome::Success
    );
    assert_eq!(
        testing::run_inline(&db.pool, id, &mailer).await.unwrap(),
        Outcome::Success
    );
    assert_eq!(mailer.0.load(Ordering::SeqCst), 2);
    assert_eq!(
        db.count_by_state().await,
        vec![("pending".to_owned(), 1)],
        "the row is untouched"
    );
}

/// run_inline reads the one task it runs: another task of the type that no
/// longer decodes does not stop it, and an id of another type is named as
/// such (it read every task of the type, and said only "no task").
#[tokio::test]
async fn run_inline_reads_its_task_alone_and_names_one_of_another_type() {
    let db = TestDb::migrated().await;
    sqlx::query(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) \
         VALUES ('test.helpers.invoice', 'helpers', '{\"renamed\": 1}', 1)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let id = outbox::submit(&mut *db.conn().await, invoice(4))
        .await
        .unwrap();
    assert_eq!(
        testing::run_inline(&db.pool, id, &Mailer::default())
            .await
            .unwrap(),
        Outcome::Success
    );
    let other: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_tasks (task_type, queue, payload, max_attempts) \
         VALUES ('test.helpers.other', 'helpers', '{}', 1) RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let pool = db.pool.clone();
    let panicked = tokio::spawn(async move {
        let _ = testing::run_inline(&pool, outbox::TaskId(other), &Mailer::default()).await;
    })
    .await
    .expect_err("a task of another type is refused");
    let message = panicked.into_panic();
    let message = message
        .downcast_ref::<String>()
        .expect("a formatted panic message");
    assert!(
        message.contains(&format!(
            "task {other} is of type \"test.helpers.other\", not \"test.helpers.invoice\""
        )),
        "{message}"
    );
}

/// A test helper of the kind applications write: `?` on a handler's result.
async fn run_boxed(
    pool: &sqlx::PgPool,
    id: outbox::TaskId,
) -> Result<Outcome, Box<dyn std::error::Error + Send + Sync>> {
    Ok(testing::run_inline(pool, id, &Mailer::default()).await?)
}

#[tokio::test]
async fn a_handler_error_converts_with_question_mark_into_a_boxed_error()
-> Result<(), Box<dyn std::error::Error>> {
    let db = TestDb::migrated().await;
    let good = SendInvoice {
        invoice: 5,
        fail: false,
    };
    let id = outbox::submit(&mut *db.conn().await, good).await?;
    assert_eq!(
        testing::run_inline(&db.pool, id, &Mailer::default()).await?,
        Outcome::Success
    );
    let bad = SendInvoice {
        invoice: 6,
        fail: true,
    };
    let id = outbox::submit(&mut *db.conn().await, bad).await?;
    let error = run_boxed(&db.pool, id).await.unwrap_err();
    assert_eq!(error.to_string(), "mail server down");
    Ok(())
}

/// Drains the invoice queue with a fresh mailer: the mailer (its count of
/// calls) and what the drain saw.
async fn drain_mailer(db: &TestDb) -> (Mailer, testing::DrainReport) {
    let mailer = Mailer::default();
    let worker = Worker::builder(db.pool.clone())
        .handler::<SendInvoice>(mailer.clone())
        .build()
        .unwrap();
    let report = testing::drain(worker, Duration::from_secs(20)).await;
    (mailer, report)
}

#[tokio::test]
async fn drain_runs_retries_without_their_backoff_and_leaves_delayed_tasks() {
    let db = TestDb::migrated().await;
    let mut batch = outbox::Batch::new();
    for invoice in 0..4 {
        batch
            .push(&SendInvoice {
                invoice,
                fail: false,
            })
            .unwrap();
    }
    batch
        .push(&SendInvoice {
            invoice: 99,
            fail: true,
        })
        .unwrap();
    let ids = batch.submit(&mut *db.conn().await).await.unwrap();
    let failing = ids[4];
    let later = outbox::submit_with(
        &mut *db.conn().await,
        SendInvoice {
            invoice: 100,
            fail: false,
        },
        outbox::TaskOptions::new().delay(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    let (mailer, report) = drain_mailer(&db).await;

    let failing = outbox::admin::get_task(&db.pool, failing)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failing.state, "dead", "every retry ran: {failing:?}");
    let attempts = failing.max_attempts as usize;
    assert!(attempts > 1, "the default retry table allows retries");
    assert_eq!(report.count(TaskEventKind::Completed), 4, "{report:?}");
    assert_eq!(
        report.count(TaskEventKind::Failed),
        attempts - 1,
        "{report:?}"
    );
    assert_eq!(report.count(TaskEventKind::Dead), 1, "{report:?}");
    assert_eq!(mailer.0.load(Ordering::SeqCst), 4 + attempts);
    let later = outbox::admin::get_task(&db.pool, later)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (later.state.as_str(), later.claims),
        ("pending", 0),
        "a task submitted with a delay is left for later"
    );
}

#[tokio::test]
async fn emitted_lists_this_transactions_events_only_and_assert_emitted_finds_one() {
    let db = TestDb::migrated().await;
    // Another transaction's event is not this one's.
    outbox::emit(
        &mut *db.conn().await,
        outbox::Event::new("order", "o-1", "order.placed", serde_json::json!({"n": 0})),
    )
    .await
    .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let placed = outbox::emit(
        &mut tx,
        outbox::Event::new("order", "o-2", "order.placed", serde_json::json!({"n": 2}))
            .header("tenant", "acme"),
    )
    .await
    .unwrap();
    outbox::emit(
        &mut tx,
        outbox::Event::new("order", "o-2", "order.paid", serde_json::json!({"n": 3})),
    )
    .await
    .unwrap();
    let all = testing::emitted(&mut tx).await;
    assert_eq!(
        all.iter()
            .map(|e| e.event_type.as_str())
            .collect::<Vec<_>>(),
        ["order.placed", "order.paid"],
        "{all:?}"
    );
    let found = testing::assert_emitted(&mut tx, "order", "o-2", "order.placed").await;
    assert_eq!(found.id, placed.id);
    assert_eq!(found.position, placed.position);
    assert_eq!(found.payload, serde_json::json!({"n": 2}));
    assert_eq!(
        found.headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    assert_eq!(found.stream, "events");
    testing::assert_none_emitted(&mut tx, "order.cancelled").await;
}

/// A transaction, left open, that emitted `order.placed` of order o-9.
async fn order_placed_in_open_transaction(
    db: &TestDb,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = db.pool.begin().await.unwrap();
    outbox::emit(
        &mut tx,
        outbox::Event::new("order", "o-9", "order.placed", serde_json::json!({})),
    )
    .await
    .unwrap();
    tx
}

#[tokio::test]
#[should_panic(
    expected = "no \"order.paid\" event of order/o-9 was emitted; emitted: [\"order.placed of order/o-9\"]"
)]
async fn assert_emitted_says_what_was_emitted_instead() {
    let db = TestDb::migrated().await;
    let mut tx = order_placed_in_open_transaction(&db).await;
    testing::assert_emitted(&mut tx, "order", "o-9", "order.paid").await;
}

#[tokio::test]
#[should_panic(expected = "expected no \"order.placed\" event")]
async fn assert_none_emitted_fails_when_one_was() {
    let db = TestDb::migrated().await;
    let mut tx = order_placed_in_open_transaction(&db).await;
    testing::assert_none_emitted(&mut tx, "order.placed").await;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[outbox_task(task_type = "test.helpers.total", queue = "helpers-results")]
struct Total {
    items: Vec<i64>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Sum {
    sum: i64,
}

struct Adder;

impl TaskHandler<Total> for Adder {
    async fn handle(&self, _ctx: TaskContext, task: Total) -> HandlerResult {
        if task.items.is_empty() {
            return Ok(Outcome::Success);
        }
        Outcome::success_with(&Sum {
            sum: task.items.iter().sum(),
        })
    }
}

#[tokio::test]
async fn result_of_decodes_what_the_handler_returns_and_drain_stores_it() {
    let db = TestDb::migrated().await;
    let id = outbox::submit(&mut *db.conn().await, Total { items: vec![2, 3] })
        .await
        .unwrap();
    let outcome = testing::run_inline(&db.pool, id, &Adder).await;
    assert_eq!(testing::result_of::<Sum>(&outcome), Some(Sum { sum: 5 }));
    let none = outbox::submit(&mut *db.conn().await, Total { items: vec![] })
        .await
        .unwrap();
    let outcome = testing::run_inline(&db.pool, none, &Adder).await;
    assert_eq!(testing::result_of::<Sum>(&outcome), None);

    let worker = Worker::builder(db.pool.clone())
        .handler::<Total>(Adder)
        .build()
        .unwrap();
    testing::drain(worker, Duration::from_secs(20)).await;
    let stored: Option<Sum> = outbox::result(&mut *db.conn().await, id).await.unwrap();
    assert_eq!(stored, Some(Sum { sum: 5 }));
}

#[tokio::test]
#[should_panic(expected = "the result does not decode as")]
async fn result_of_says_when_the_result_is_not_the_type_asked_for() {
    let outcome: HandlerResult = Ok(Outcome::SuccessWith(serde_json::json!({"sum": "five"})));
    testing::result_of::<Sum>(&outcome);
}

#[tokio::test]
async fn tick_submits_what_a_periodic_tick_would_and_drain_runs_it() {
    let db = TestDb::migrated().await;
    let nightly = outbox::periodic::PeriodicTask::new(
        "nightly-invoice",
        "0 3 * * *",
        &SendInvoice {
            invoice: 42,
            fail: false,
        },
    )
    .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let id = testing::tick(&mut tx, &nightly).await;
    let submitted = testing::assert_submitted(
        &mut tx,
        &SendInvoice {
            invoice: 42,
            fail: false,
        },
    )
    .await;
    assert_eq!(submitted, id);
    tx.commit().await.unwrap();

    let (mailer, report) = drain_mailer(&db).await;
    assert_eq!(report.count(TaskEventKind::Completed), 1, "{report:?}");
    assert_eq!(mailer.0.load(Ordering::SeqCst), 1);
    let task = outbox::admin::get_task(&db.pool, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(task.queue, "helpers");
}
