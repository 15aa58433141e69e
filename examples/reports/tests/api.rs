//! The report flow over HTTP: 202 with an id, then pending -> running ->
//! done, and failed for a request that can never succeed.

use std::time::Duration;

use outbox_tests::TestDb;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

async fn status(client: &reqwest::Client, base: &str, id: &Value) -> Value {
    client
        .get(format!("{base}/reports/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn wait_for(client: &reqwest::Client, base: &str, id: &Value, wanted: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = status(client, base, id).await;
        if now["status"] == wanted {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "report {id} never became {wanted}: {now}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_goes_from_pending_to_running_to_done() {
    let db = TestDb::empty().await;
    reports_example::setup(&db.pool).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, reports_example::router(db.pool.clone())).into_future());
    let client = reqwest::Client::new();

    let accepted = client
        .post(format!("{base}/reports"))
        .json(&json!({ "from": "2026-01-01T00:00:00Z", "to": "2026-01-11T00:00:00Z" }))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    let id = accepted.json::<Value>().await.unwrap()["id"].clone();
    assert_eq!(
        status(&client, &base, &id).await["status"],
        "pending",
        "no worker yet"
    );

    let doomed = client
        .post(format!("{base}/reports"))
        .json(&json!({ "from": "2026-02-01T00:00:00Z", "to": "2026-01-01T00:00:00Z" }))
        .send()
        .await
        .unwrap();
    let doomed = doomed.json::<Value>().await.unwrap()["id"].clone();

    let shutdown = CancellationToken::new();
    let worker = reports_example::worker(db.pool.clone(), Duration::from_millis(50)).unwrap();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_for(&client, &base, &id, "running").await;
    let done = wait_for(&client, &base, &id, "done").await;
    assert_eq!(done["report"], json!({ "days": 10, "total": 1045 }));
    let failed = wait_for(&client, &base, &doomed, "failed").await;
    assert!(
        failed["last_error"]
            .as_str()
            .unwrap()
            .contains("1 to 366 days"),
        "{failed}"
    );
    let missing = client
        .get(format!("{base}/reports/999999"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    shutdown.cancel();
    running.await.unwrap().unwrap();
}
