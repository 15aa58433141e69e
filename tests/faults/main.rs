//! Fault injection with real processes and a real PostgreSQL: kill -9 of a
//! worker, SIGTERM with slow tasks, loss of the maintenance leader, and a
//! database restart in the middle of a drain. Each test prints what it
//! injected and what it counted afterwards.

mod kill;
mod leader;
mod restart;
mod sigterm;

/// The worker binary with the harness's task types linked in.
const WORKER: &str = env!("CARGO_BIN_EXE_outbox-test-worker");
