//! Drives the orders example for real: the API, the worker and the webhook
//! receiver as separate processes on a real PostgreSQL, with a worker killed
//! mid-flight. Every order's event must reach the receiver exactly once
//! after deduplication.

use std::process::Command;
use std::time::Duration;

use outbox_tests::TestDb;
use outbox_tests::process::{ServerProcess, WorkerProcess, wait_until};

const API: &str = env!("CARGO_BIN_EXE_orders-api");
const WORKER: &str = env!("CARGO_BIN_EXE_orders-worker");
const RECEIVER: &str = env!("CARGO_BIN_EXE_webhook-receiver");

fn free_addr() -> String {
    format!("127.0.0.1:{}", outbox_tests::brokers::free_port())
}

async fn start(binary: &str, envs: &[(&str, &str)], addr: &str) -> ServerProcess {
    let mut command = Command::new(binary);
    command.envs(envs.iter().copied());
    ServerProcess::start(command, addr).await
}

async fn start_api(db: &TestDb, api: &str) -> ServerProcess {
    start(API, &[("DATABASE_URL", &db.url), ("ORDERS_ADDR", api)], api).await
}

async fn place_orders(client: &reqwest::Client, api: &str, range: std::ops::Range<i64>) {
    for i in range {
        let response = client
            .post(format!("http://{api}/orders"))
            .json(&serde_json::json!({ "customer": format!("customer-{i}"), "amount_cents": 100 + i }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
    }
}

async fn received(client: &reqwest::Client, receiver: &str) -> serde_json::Value {
    client
        .get(format!("http://{receiver}/events"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

const WORKER_ARGS: &[&str] = &[
    "--queue",
    "orders=8",
    "--poll-interval",
    "200ms",
    "--heartbeat-interval",
    "100ms",
    "--heartbeat-timeout",
    "1s",
    "--maintenance-interval",
    "100ms",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_event_arrives_exactly_once_after_dedup_even_across_a_worker_kill() {
    let db = TestDb::empty().await;
    let (api, receiver) = (free_addr(), free_addr());
    let webhook = format!("http://{receiver}/events");
    let _receiver = start(
        RECEIVER,
        &[("RECEIVER_ADDR", &receiver), ("RECEIVER_DELAY_MS", "100")],
        &receiver,
    )
    .await;
    let _api = start_api(&db, &api).await;
    let client = reqwest::Client::new();

    place_orders(&client, &api, 0..30).await;
    let mut first =
        WorkerProcess::spawn_with_env(WORKER, &db.url, WORKER_ARGS, &[("WEBHOOK_URL", &webhook)]);
    // Kill the worker while deliveries are in flight (the receiver takes
    // 100 ms per event).
    let in_flight = first.kill_mid_flight(&db.pool, 5, 1).await;

    place_orders(&client, &api, 30..40).await;
    let second =
        WorkerProcess::spawn_with_env(WORKER, &db.url, WORKER_ARGS, &[("WEBHOOK_URL", &webhook)]);
    wait_until(
        &db.pool,
        "SELECT count(*) = 40 FROM outbox_all_tasks WHERE state = 'completed'",
        Duration::from_secs(60),
    )
    .await;
    drop(second);

    let report = received(&client, &receiver).await;
    let mut order_ids: Vec<i64> = report["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["order_id"].as_i64().unwrap())
        .collect();
    order_ids.sort_unstable();
    let orders: Vec<i64> = sqlx::query_scalar("SELECT id FROM orders ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    eprintln!(
        "orders e2e: 40 orders, worker killed with {in_flight} deliveries in flight; receiver got {} deliveries, \
         {} unique, {} duplicates dropped by idempotency key",
        report["deliveries"], report["unique"], report["duplicates"]
    );
    assert_eq!(orders.len(), 40);
    assert_eq!(
        order_ids, orders,
        "each order's event exactly once after deduplication"
    );
    assert!(report["duplicates"].as_u64().unwrap() <= in_flight as u64);
}

#[tokio::test]
async fn a_failed_order_insert_submits_no_event() {
    let db = TestDb::empty().await;
    let api = free_addr();
    let _api = start_api(&db, &api).await;
    let client = reqwest::Client::new();
    let refused = client
        .post(format!("http://{api}/orders"))
        .json(&serde_json::json!({ "customer": "nobody", "amount_cents": -5 }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    place_orders(&client, &api, 0..1).await;
    assert_eq!(
        db.task_count().await,
        1,
        "only the order that was saved has an event"
    );
}
