//! Shutdown on SIGTERM or SIGINT, for the CLI and for applications that
//! embed a worker: `tokio::spawn(outbox_worker::stop_on_signal(token.clone()))`.

use tokio_util::sync::CancellationToken;

use crate::failure::EXIT_RUNTIME;

/// Cancels `token` on the first SIGTERM or SIGINT; a second one ends the
/// process at once (exit code 1), for an operator who will not wait for the
/// grace period. Tasks it was running are recovered after the heartbeat
/// timeout.
pub async fn stop_on_signal(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the worker with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    token.cancel();
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::warn!(
        "second signal: exiting now; tasks still running are recovered after the heartbeat timeout"
    );
    std::process::exit(i32::from(EXIT_RUNTIME));
}
