//! Running the real `outbox-worker` binary, shared by the CLI test files.
// Each test file is its own crate and uses only some of these.
#![allow(dead_code)]

use std::process::Output;

/// The binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_outbox-worker");

/// Runs the binary with `args`, without DATABASE_URL, quietly, as an
/// operator runs it (not through cargo: without the package name cargo
/// gives the processes it starts).
pub(crate) async fn cli(args: &[&str]) -> Output {
    tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("CARGO_PKG_NAME")
        .env("OUTBOX_LOG", "warn")
        .output()
        .await
        .expect("run outbox-worker")
}

/// Standard output as text.
pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Standard error as text.
pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Standard output of a command that must have succeeded.
#[track_caller]
pub(crate) fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// Submits an `outbox.noop` task through the CLI to the database at `url`;
/// returns its id.
pub(crate) async fn submit_noop(url: &str) -> String {
    let out = cli(&[
        "tasks",
        "submit",
        "outbox.noop",
        "{}",
        "--database-url",
        url,
    ])
    .await;
    ok(&out).trim().to_owned()
}
