//! The relay against a real rabbitmq-server: a durable topic exchange, a
//! durable queue bound to the orders' routing key, publisher confirms.

use std::time::Duration;

use futures_util::StreamExt as _;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_tests::brokers::{self, BrokerProcess, Kind};

use crate::scenario::{self, Broker, CONCURRENCY, Published};

struct Rabbit {
    server: BrokerProcess,
}

impl Rabbit {
    async fn start() -> Option<Self> {
        let server = brokers::start(Kind::Rabbitmq).await?;
        let rabbit = Self { server };
        rabbit.declare().await;
        Some(rabbit)
    }

    fn url(&self) -> String {
        Kind::Rabbitmq.url(&self.server)
    }

    /// The test's own connection, tried for up to a minute: the broker is
    /// ready once its port accepts, but a node still booting on a loaded
    /// machine can abort the AMQP handshake (CI once failed with
    /// `ConnectionAborted` on the first connect after the start).
    async fn connect(&self) -> Connection {
        let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.server.port);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match Connection::connect(&url, ConnectionProperties::default()).await {
                Ok(conn) => return conn,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    eprintln!("rabbitmq: connect failed ({e}); trying again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("connect to RabbitMQ: {e}\n{}", self.server.log()),
            }
        }
    }

    /// The exchange, and a queue taking the orders' events.
    async fn declare(&self) {
        let conn = self.connect().await;
        let ch = conn.create_channel().await.unwrap();
        ch.exchange_declare(
            "outbox".into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_declare(
            "orders".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_bind(
            "orders".into(),
            "outbox".into(),
            "outbox.event.order".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        let _ = conn.close(0, "done".into()).await;
    }
}

impl Broker for Rabbit {
    fn relay_url(&self) -> String {
        // A broker just restarted returns messages while its durable queues
        // come back (seen in one run of two here): five refusals, a second
        // apart, before an aggregate is parked.
        format!("{}?concurrency={CONCURRENCY}&give_up_after=5", self.url())
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![("OUTBOX_RELAY_R_SECRET", "guest".to_owned())]
    }

    async fn prepare_poison(&mut self) -> serde_json::Value {
        // No queue is bound to outbox.event.poison: the broker returns the
        // mandatory message.
        serde_json::json!({ "poison": true })
    }

    async fn kill_and_restart(&mut self) {
        self.server.restart().await;
    }

    fn duplicates_bound(&self, unacknowledged: usize) -> usize {
        // RabbitMQ keeps every confirmed copy: at most one per event
        // published again.
        unacknowledged
    }

    async fn read_all(&mut self) -> Vec<Published> {
        let conn = self.connect().await;
        let ch = conn.create_channel().await.unwrap();
        let queue = ch
            .queue_declare(
                "orders".into(),
                QueueDeclareOptions {
                    durable: true,
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("the orders queue");
        let total = queue.message_count() as usize;
        let mut consumer = ch
            .basic_consume(
                "orders".into(),
                "reader".into(),
                // Read once and dropped with the broker: acknowledging
                // each of some 18,000 messages, an awaited write each,
                // took several seconds of the test.
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut out = Vec::new();
        while out.len() < total {
            // The queue holds `total`: each is waited for generously.
            let next =
                tokio::time::timeout(std::time::Duration::from_secs(60), consumer.next()).await;
            let Ok(Some(Ok(delivery))) = next else {
                panic!(
                    "read {} of the queue's {total} messages, then: {next:?}",
                    out.len()
                )
            };
            let headers = delivery.properties.headers().clone().unwrap_or_default();
            let get = |name: &str| match headers.inner().get(name) {
                Some(AMQPValue::LongString(s)) => {
                    String::from_utf8_lossy(s.as_bytes()).into_owned()
                }
                _ => String::new(),
            };
            let message_id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default();
            assert_eq!(message_id, get("event-id"), "message_id is the event id");
            assert_eq!(*delivery.properties.delivery_mode(), Some(2), "persistent");
            out.push(Published::from_headers(get));
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_relay_survives_kills_restarts_and_poison() {
    let _turn = crate::heavy_turn().await;
    let Some(mut rabbit) = Rabbit::start().await else {
        return;
    };
    scenario::run("rabbitmq", &mut rabbit).await;
}
