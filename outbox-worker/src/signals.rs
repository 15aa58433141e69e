//! Shutdown on SIGTERM or SIGINT, for the CLI and for applications that
//! embed a worker: `tokio::spawn(outbox_worker::stop_on_signal(token.clone()))`.

use tokio_util::sync::CancellationToken;

use crate::failure::EXIT_RUNTIME;

/// A signal this soon after the first is a copy of it, not an operator's
/// second request.
const SAME_REQUEST: std::time::Duration = std::time::Duration::from_millis(500);

/// Cancels `token` on the first SIGTERM or SIGINT; a second one (half a
/// second or more after the first) ends the process at once (exit code 1),
/// for an operator who will not wait for the grace period. Tasks it was
/// running are recovered after the heartbeat timeout.
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
    let first = std::time::Instant::now();
    loop {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        // GNU `timeout` (without --foreground), and supervisors that signal
        // a process and then its group, deliver one request twice within
        // microseconds: a repeat that close is the same request.
        if first.elapsed() >= SAME_REQUEST {
            break;
        }
        tracing::info!("the stop signal again at once: taken as the same request");
    }
    tracing::warn!(
        "second signal: exiting now; tasks still running are recovered after the heartbeat timeout"
    );
    std::process::exit(i32::from(EXIT_RUNTIME));
}
