//! Fault injection with real processes and a real PostgreSQL: kill -9 of a
//! worker, SIGTERM with slow tasks, loss of the maintenance leader, a
//! database restart and outage in the middle of a drain, sessions
//! terminated again and again, a network that goes silent (a fault proxy
//! black-holes a worker's connections), a relay through a restart, an
//! outage and terminated sessions, and all of it behind PgBouncer. Each test prints what it
//! injected and what it counted afterwards.

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
mod terminate;
mod txcomplete;
mod workflow;

/// The worker binary with the harness's task types linked in.
const WORKER: &str = env!("CARGO_BIN_EXE_outbox-test-worker");
