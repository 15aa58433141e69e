//! The relay against a real nats-server with JetStream.

use futures_util::StreamExt as _;
use outbox_tests::brokers::{self, BrokerProcess, Kind};

use crate::scenario::{self, Broker, CONCURRENCY, Published};

struct Nats {
    server: BrokerProcess,
}

impl Nats {
    async fn start() -> Option<Self> {
        let server = brokers::start(Kind::Nats).await?;
        Some(Self { server })
    }

    fn url(&self) -> String {
        Kind::Nats.url(&self.server)
    }
}

impl Broker for Nats {
    fn relay_url(&self) -> String {
        format!(
            "{}?stream=EVENTS&concurrency={CONCURRENCY}&give_up_after=1",
            self.url()
        )
    }

    async fn prepare_poison(&mut self) -> serde_json::Value {
        // Larger than the server's max_payload (1 MB): refused by the
        // client for good, whatever the attempt.
        serde_json::json!({ "blob": "x".repeat(1_100_000) })
    }

    async fn kill_and_restart(&mut self) {
        self.server.restart().await;
    }

    fn duplicates_bound(&self, _unacknowledged: usize) -> usize {
        // Nats-Msg-Id within the duplicate window: JetStream keeps one.
        0
    }

    async fn read_all(&mut self) -> Vec<Published> {
        let client = async_nats::connect(self.url())
            .await
            .expect("connect to NATS");
        let js = async_nats::jetstream::new(client);
        let stream = js
            .get_stream("EVENTS")
            .await
            .expect("the stream the relay made");
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                filter_subject: "outbox.event.order".to_owned(),
                ..Default::default()
            })
            .await
            .expect("an ordered consumer");
        // The subject's messages, as the server counted them at creation.
        let total = consumer.cached_info().num_pending as usize;
        let mut messages = consumer.messages().await.expect("messages");
        let mut out = Vec::new();
        while out.len() < total {
            // The stream holds `total`: each is waited for generously (a
            // short wait turned a loaded machine's pause into lost events).
            let next =
                tokio::time::timeout(std::time::Duration::from_secs(60), messages.next()).await;
            let Ok(Some(Ok(m))) = next else {
                panic!(
                    "read {} of the stream's {total} messages, then: {next:?}",
                    out.len()
                )
            };
            let headers = m.headers.as_ref().expect("headers");
            let get = |name: &str| {
                headers
                    .get(name)
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default()
            };
            assert_eq!(
                get("Nats-Msg-Id"),
                format!("{}:{}", get("event-id"), m.subject),
                "the dedup id is the event id and the subject"
            );
            assert!(!get("traceparent").is_empty(), "the traceparent travels");
            out.push(Published::from_headers(get));
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_relay_survives_kills_restarts_and_poison() {
    let _turn = crate::heavy_turn().await;
    let Some(mut nats) = Nats::start().await else {
        return;
    };
    scenario::run("nats", &mut nats).await;
    let _ = nats.server.log();
}

/// An event published twice within the stream's duplicate window (a
/// relay's republish, or an operator's rewind) is acknowledged and not
/// stored again: the sink counts it, and warns, so that a rewind that
/// delivered nothing does not pass for one that did.
#[tokio::test]
async fn a_repeat_jetstream_drops_is_counted() {
    use outbox::relay::Sink as _;
    use outbox::relay::nats::{NatsSink, StreamSpec};
    let Some(nats) = Nats::start().await else {
        return;
    };
    let sink = NatsSink::connect(
        &nats.url(),
        Some(StreamSpec {
            name: "REPEATS".to_owned(),
            subjects: vec!["repeats.>".to_owned()],
            duplicate_window: std::time::Duration::from_secs(600),
        }),
    )
    .await
    .unwrap();
    let message = outbox::relay::Message {
        event_id: "0191f0a0-0000-7000-8000-000000000001".to_owned(),
        aggregate_type: "order".to_owned(),
        aggregate_id: "1".to_owned(),
        event_type: "placed".to_owned(),
        payload: b"{}".to_vec(),
        headers: Vec::new(),
        sequence: 1,
        created_at: chrono::Utc::now(),
        destination: "repeats.order".to_owned(),
    };
    sink.publish(&message).await.unwrap();
    assert_eq!(sink.repeats_acknowledged(), 0);
    sink.publish(&message).await.unwrap();
    assert_eq!(sink.repeats_acknowledged(), 1, "acknowledged, not stored");
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let mut stream = js.get_stream("REPEATS").await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1);
}
