//! Run with: DATABASE_URL=postgres://... cargo run -p events-example --bin events-worker -- \
//!     run --relay 'nats=nats://127.0.0.1:4222?stream=EVENTS'
//!
//! The relay: the stock `outbox-worker` CLI, which publishes the event log
//! (as the subscription `nats`) to NATS JetStream (making the stream EVENTS over `outbox.event.>`
//! when it is missing), in per-customer order, at least once, with the
//! event id and the subject as `Nats-Msg-Id` (`<event id>:<subject>`).

fn main() -> std::process::ExitCode {
    outbox_worker::main()
}
