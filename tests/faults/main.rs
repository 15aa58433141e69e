//! Fault injection with real processes and a real PostgreSQL: kill -9 of a
//! worker, SIGTERM with slow tasks, loss of the maintenance leader, a
//! database restart and outage in the middle of a drain, sessions
//! terminated again and again, a network that goes silent (a fault proxy
//! black-holes a worker's connections), a relay through a restart, an
//! outage and terminated sessions, and all of it behind PgBouncer. Each test prints what it
//! injected and what it counted afterwards.

// libtest starts a binary's tests in the order of their names. The
// terminated sessions' hot-key tests are the suite's longest (80-110 s in
// CI); named `terminate` they started last and ran on alone after every
// other test had finished. Their module's name sorts first.
mod backends_terminated;
mod blackhole;
mod cluster;
mod kill;
mod leader;
mod otel;
mod periodic;
mod pooler;
mod relay;
mod restart;
mod sigterm;
mod table_health;
mod txcomplete;
mod workflow;

/// The worker binary with the harness's task types linked in.
const WORKER: &str = env!("CARGO_BIN_EXE_outbox-test-worker");
