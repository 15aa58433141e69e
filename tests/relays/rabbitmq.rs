//! The relay against a real rabbitmq-server: a durable topic exchange, a
//! durable queue bound to the orders' routing key, publisher confirms.

use futures_util::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_tests::brokers::{BrokerProcess, find_binary, free_port};

use crate::scenario::{self, Broker, CONCURRENCY, Published};

struct Rabbit {
    server: BrokerProcess,
    /// The port of the node's own epmd, which daemonizes: stopped at drop.
    epmd: String,
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        self.server.kill();
        let _ = std::process::Command::new("epmd")
            .args(["-port", &self.epmd, "-kill"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Rabbit {
    async fn start() -> Option<Self> {
        let binary = find_binary(
            "rabbitmq-server",
            &["/usr/lib/rabbitmq/bin/rabbitmq-server"],
        )?;
        // The script itself (not Debian's wrapper, which switches user),
        // with a node, ports, cookie and data of its own;
        // RUNNING_UNDER_SYSTEMD makes it exec the VM (with no shell reading stdin),
        // so the process killed is the broker.
        let epmd = free_port().to_string();
        let dist = free_port().to_string();
        let port = free_port();
        let server = BrokerProcess::start_with_env(
            "rabbitmq",
            &binary,
            &[],
            &[
                ("RABBITMQ_NODENAME", "outbox-{port}@localhost"),
                ("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1"),
                ("RABBITMQ_NODE_PORT", "{port}"),
                ("RABBITMQ_DIST_PORT", &dist),
                ("ERL_EPMD_PORT", &epmd),
                ("ERL_EPMD_ADDRESS", "127.0.0.1"),
                ("RABBITMQ_MNESIA_BASE", "{dir}/mnesia"),
                ("RABBITMQ_LOG_BASE", "{dir}/log"),
                ("RABBITMQ_CONFIG_FILE", "{dir}/rabbitmq"),
                ("RABBITMQ_ADVANCED_CONFIG_FILE", "{dir}/advanced.config"),
                ("RABBITMQ_ENABLED_PLUGINS_FILE", "{dir}/enabled_plugins"),
                ("RABBITMQ_PID_FILE", "{dir}/rabbitmq.pid"),
                ("RUNNING_UNDER_SYSTEMD", "true"),
                ("HOME", "{dir}"),
            ],
            port,
        )
        .await;
        let rabbit = Self { server, epmd };
        rabbit.declare().await;
        Some(rabbit)
    }

    fn url(&self) -> String {
        format!("amqp://guest@127.0.0.1:{}/%2f", self.server.port)
    }

    async fn connect(&self) -> Connection {
        let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.server.port);
        Connection::connect(&url, ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ")
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
        format!("{}?concurrency={CONCURRENCY}&give_up_after=1", self.url())
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
        self.server.kill();
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        self.server.restart().await;
    }

    fn duplicates_bound(&self, reclaimed: usize) -> usize {
        // RabbitMQ keeps every confirmed copy: at most one per claim past
        // the first.
        reclaimed
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
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut out = Vec::new();
        while out.len() < total {
            let next =
                tokio::time::timeout(std::time::Duration::from_secs(5), consumer.next()).await;
            let Ok(Some(Ok(delivery))) = next else { break };
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
            out.push(Published {
                event_id: get("event-id"),
                aggregate_id: get("aggregate-id"),
                sequence: get("sequence").parse().expect("a sequence"),
            });
            delivery.ack(BasicAckOptions::default()).await.unwrap();
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_relay_survives_kills_restarts_and_poison() {
    let Some(mut rabbit) = Rabbit::start().await else {
        return;
    };
    scenario::run("rabbitmq", &mut rabbit).await;
}
