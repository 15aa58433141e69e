//! The stock `outbox-worker` binary: the built-in task types and the full CLI.

/// mimalloc, not the system's malloc: a relay allocates a few dozen small
/// buffers per event (the row, the message, the broker's frame) on one
/// thread and frees many on another, which glibc's arenas pay for in
/// locking and consolidation. Alternating runs of `bench --relay nats`
/// drained 13% more events a second and two subscriptions took 15% less
/// time (PERFORMANCE.md, "The allocator"); the task engine waits on the
/// database and measured the same, at about twice the peak RSS (50 MB).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    outbox_worker::main()
}
