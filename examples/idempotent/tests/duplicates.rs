//! A duplicate execution writes nothing twice.

use std::time::Duration;

use idempotent_effect::{Capture, CapturePayment, payments_for, setup};
use outbox::{TaskEventKind, Worker};
use outbox_tests::TestDb;

#[tokio::test]
async fn running_a_task_twice_writes_one_payment() {
    let db = TestDb::empty().await;
    setup(&db.pool).await.unwrap();
    let first = outbox::submit(
        &mut *db.conn().await,
        CapturePayment {
            invoice_id: 1,
            amount_cents: 10,
        },
    )
    .await
    .unwrap();
    outbox::submit(
        &mut *db.conn().await,
        CapturePayment {
            invoice_id: 2,
            amount_cents: 20,
        },
    )
    .await
    .unwrap();

    // A worker died after the effect: the task runs again.
    outbox::testing::run_inline(&db.pool, first, &Capture)
        .await
        .unwrap();
    let worker = Worker::builder(db.pool.clone())
        .handler::<CapturePayment>(Capture)
        .build()
        .unwrap();
    let report = outbox::testing::drain(worker, Duration::from_secs(20)).await;
    assert_eq!(report.count(TaskEventKind::Completed), 2);
    assert_eq!(payments_for(&db.pool, 1).await.unwrap(), 1);
    assert_eq!(payments_for(&db.pool, 2).await.unwrap(), 1);
}
