//! The worker binary the fault tests start, kill and signal: the stock
//! `outbox-worker` CLI with the harness's task types linked in, built the
//! way an application builds its own worker binary.

fn main() -> std::process::ExitCode {
    outbox_worker::main_with(outbox_tests::tasks::register)
}
