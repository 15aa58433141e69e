//! The relay against a local HTTP receiver: signed POSTs, a receiver that
//! goes away and comes back on the same port, and a 422 for the poison.

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use outbox_tests::brokers::free_port;

use crate::scenario::{self, Broker, CONCURRENCY, POISON_TYPE, Published};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

struct Receiver {
    port: u16,
    /// What it acknowledged, in order (its "data directory": kept across
    /// restarts).
    got: Arc<Mutex<Vec<Published>>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Receiver {
    async fn start() -> Self {
        let mut r = Self {
            port: free_port(),
            got: Arc::default(),
            server: None,
        };
        r.serve();
        r
    }

    fn serve(&mut self) {
        let got = Arc::clone(&self.got);
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        socket
            .bind(([127, 0, 0, 1], self.port).into())
            .expect("bind the receiver's port");
        let listener = socket.listen(1024).expect("listen");
        let app = axum::Router::new().route(
            "/hook",
            post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let got = Arc::clone(&got);
                async move { receive(&got, &headers, &body) }
            }),
        );
        self.server = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        }));
    }
}

fn receive(got: &Mutex<Vec<Published>>, headers: &HeaderMap, body: &[u8]) -> StatusCode {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let secret = base64_decode(SECRET.trim_start_matches("whsec_"));
    let expected = outbox::relay::webhook::signature(
        &secret,
        &get("webhook-id"),
        &get("webhook-timestamp"),
        body,
    );
    if get("webhook-signature") != expected {
        return StatusCode::UNAUTHORIZED;
    }
    if get("outbox-aggregate-type") == POISON_TYPE {
        return StatusCode::UNPROCESSABLE_ENTITY;
    }
    assert_eq!(get("webhook-id"), get("outbox-event-id"));
    assert!(!get("traceparent").is_empty(), "the traceparent travels");
    got.lock().unwrap().push(Published {
        event_id: get("webhook-id"),
        aggregate_id: get("outbox-aggregate-id"),
        sequence: get("outbox-sequence").parse().unwrap_or(-1),
    });
    StatusCode::NO_CONTENT
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64")
}

impl Broker for Receiver {
    fn relay_url(&self) -> String {
        format!(
            "http://127.0.0.1:{}/hook?concurrency={CONCURRENCY}&give_up_after=1",
            self.port
        )
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![("OUTBOX_RELAY_R_SECRET", SECRET.to_owned())]
    }

    async fn prepare_poison(&mut self) -> serde_json::Value {
        serde_json::json!({ "poison": true })
    }

    async fn kill_and_restart(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        self.serve();
    }

    fn duplicates_bound(&self, unacknowledged: usize) -> usize {
        // A receiver that took the POST but whose answer was lost, or whose
        // relay died before its cursor moved, gets it again.
        unacknowledged
    }

    async fn read_all(&mut self) -> Vec<Published> {
        self.got.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_relay_survives_kills_restarts_and_poison() {
    let _turn = crate::heavy_turn().await;
    let mut receiver = Receiver::start().await;
    scenario::run("webhook", &mut receiver).await;
}

/// `Relay::from_url_with_secret`: the signing key from the application's
/// own settings, with nothing in the environment (the receiver refuses a
/// POST whose signature does not check out, so every event it recorded was
/// signed with the key given in code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_given_in_code_signs_the_posts() {
    use outbox::relay::Relay;
    use tokio_util::sync::CancellationToken;

    let receiver = Receiver::start().await;
    let db = outbox_tests::TestDb::migrated().await;
    let url = format!("http://127.0.0.1:{}/hook", receiver.port);
    assert!(
        std::env::var("OUTBOX_RELAY_FROM_CODE_SECRET").is_err(),
        "the environment must not hold this relay's secret"
    );
    let relay = Relay::from_url_with_secret("from-code", &url, SECRET)
        .await
        .expect("a relay from the URL and the secret");
    let mut ids = Vec::new();
    for i in 0..3 {
        let event = outbox::Event::new("order", format!("o-{i}"), "order.placed", i)
            .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        ids.push(outbox::emit(&mut *db.conn().await, event).await.unwrap().id);
    }
    let worker = outbox::Worker::builder(db.pool.clone())
        .relay(relay.poll_interval(std::time::Duration::from_millis(10)))
        .build()
        .expect("a relay worker");
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let mut got: Vec<String> = receiver
            .got
            .lock()
            .unwrap()
            .iter()
            .map(|p| p.event_id.clone())
            .collect();
        got.sort();
        got.dedup();
        if got.len() == ids.len() {
            ids.sort();
            assert_eq!(got, ids);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the receiver took {got:?} of {ids:?} within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.expect("worker task").expect("worker run");
}
