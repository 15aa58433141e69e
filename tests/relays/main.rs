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
mod preflight;
mod rabbitmq;
mod redis;
mod scenario;
mod two_sinks;
mod webhook;

/// Waits for a turn to run one of the heavy tests (a broker, two relay
/// workers and thousands of events), as many at once as the machine has
/// cores (at least two). Unlike the other suites this one keeps the cores
/// busy (3% idle with two tests on two cores), so when CI gives the test
/// binaries more threads than cores (.ci/run) more of these at once would
/// only stretch each one towards its deadlines.
async fn heavy_turn() -> tokio::sync::SemaphorePermit<'static> {
    static TURNS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    TURNS
        .get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(2, usize::from);
            tokio::sync::Semaphore::new(cores.max(2))
        })
        .acquire()
        .await
        .expect("the semaphore is never closed")
}

/// The worker binary with the harness's task types linked in.
const WORKER: &str = env!("CARGO_BIN_EXE_outbox-test-worker");
