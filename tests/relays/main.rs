//! Relays against real brokers: nats-server, rabbitmq-server and
//! redis-server from Debian's packages, started here on free loopback
//! ports, librdkafka's mock Kafka cluster in a process of its own, and a
//! local HTTP receiver for webhooks. Each runs the same scenario of kills,
//! restarts and a poison event (scenario.rs); NATS also has its
//! connection black-holed (blackhole.rs). A suite whose server is not
//! installed is skipped, unless CI is set: then it fails.

mod blackhole;
mod kafka;
mod nats;
mod rabbitmq;
mod redis;
mod scenario;
mod two_sinks;
mod webhook;

/// The worker binary with the harness's task types linked in.
const WORKER: &str = env!("CARGO_BIN_EXE_outbox-test-worker");
