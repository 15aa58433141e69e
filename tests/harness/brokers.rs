//! Throwaway brokers for the relay tests: see
//! `outbox_worker::local_broker`. A suite whose server is missing is
//! skipped on a developer's machine and fails in CI.

use std::path::PathBuf;

pub use outbox_worker::local_broker::{BrokerProcess, Kind, free_port};

/// `name`'s path, or None (skip) when it is not installed; in CI (where
/// `.ci/install-brokers` should have installed it) a missing server fails.
pub fn find_binary(name: &str, candidates: &[&str]) -> Option<PathBuf> {
    let found = outbox_worker::local_broker::find_binary(name, candidates);
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is not installed, and CI is set: run .ci/install-brokers"
        );
        eprintln!("skipping: {name} is not installed (bash .ci/install-brokers installs it)");
    }
    found
}

/// A broker of `kind` started on a free port, or None (skip) when its
/// server is not installed (a failure in CI).
pub async fn start(kind: Kind) -> Option<BrokerProcess> {
    let (name, candidates) = kind.binary();
    let binary = find_binary(name, candidates)?;
    Some(kind.start(&binary).await)
}
