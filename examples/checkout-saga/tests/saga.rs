//! The checkout saga end to end: an order in stock ships; an order out of
//! stock is refunded, and the stock is as it was.

use std::time::Duration;

use checkout_saga::{place_order, register, setup, wait_for_end};
use outbox::Worker;
use outbox_tests::{RunningWorker, TestDb};

#[tokio::test]
async fn an_order_in_stock_ships_and_one_out_of_stock_is_refunded() {
    let db = TestDb::empty().await;
    setup(&db.pool).await.unwrap();
    let fits = place_order(&db.pool, 1, "lamp", 2, 3998).await.unwrap();
    let too_many = place_order(&db.pool, 2, "lamp", 10, 19990).await.unwrap();
    let worker = RunningWorker::start(register(Worker::builder(db.pool.clone())).build().unwrap());
    let within = Duration::from_secs(60);
    assert_eq!(
        wait_for_end(&db.pool, fits, within).await.unwrap(),
        "completed"
    );
    assert_eq!(
        wait_for_end(&db.pool, too_many, within).await.unwrap(),
        "compensated"
    );
    worker.stop().await;

    let row = |sql: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_as::<_, (i64, bool)>(sql)
                .fetch_all(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        row("SELECT order_id, refunded FROM payments ORDER BY order_id").await,
        [(1, false), (2, true)]
    );
    assert_eq!(
        row("SELECT order_id, true FROM shipments").await,
        [(1, true)]
    );
    let available: i64 = sqlx::query_scalar("SELECT available FROM stock WHERE sku = 'lamp'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        available, 3,
        "the shipped order took 2 of 5; nothing else was kept"
    );
    let status = outbox::workflow::workflow_status(&db.pool, too_many)
        .await
        .unwrap()
        .unwrap();
    let reserve = status
        .step_list
        .iter()
        .find(|s| s.name == "reserve")
        .unwrap();
    assert_eq!(reserve.state, "dead");
    assert_eq!(
        reserve.last_error.as_deref(),
        Some("10 x lamp is not in stock")
    );
    let names: Vec<&str> = status.step_list.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["charge", "reserve", "ship", "undo:charge"]);
}
