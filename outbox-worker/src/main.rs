//! The stock `outbox-worker` binary: the built-in task types and the full CLI.

fn main() -> std::process::ExitCode {
    outbox_worker::main()
}
