//! The end of a worker's run: handlers get their grace period, and
//! whatever the worker still holds is released, each step bounded whether
//! the database is up, down or silent.

use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::Shared;
use super::outage::Outage;
use crate::db::classify::is_transient;
use crate::db::session::call;

/// Waits for the handlers until `grace_over`; then fires their cancellation
/// token and, after `cancel_grace`, aborts those still running (their tasks
/// stay held and are released with the rest).
pub(super) async fn finish_handlers(shared: &Shared, tracker: &TaskTracker, grace_over: Instant) {
    if tokio::time::timeout_at(grace_over, tracker.wait())
        .await
        .is_ok()
    {
        return;
    }
    tracing::warn!(
        in_flight = shared.holdings.len(),
        "grace period over: cancelling in-flight tasks"
    );
    shared.handler_cancel.cancel();
    let cancel_grace = shared.config.cancel_grace;
    if tokio::time::timeout(cancel_grace, tracker.wait())
        .await
        .is_ok()
    {
        return;
    }
    let aborted = shared.holdings.abort_running();
    tracing::warn!(
        aborted,
        "handlers still running after cancellation: aborted"
    );
    // An aborted handler stops at its next await; one that never yields
    // cannot be stopped, and must not keep us from exiting.
    if tokio::time::timeout(cancel_grace, tracker.wait())
        .await
        .is_err()
    {
        tracing::error!("a handler ignores cancellation and never yields; exiting without it");
    }
}

/// Puts every task this worker still holds back to PENDING without counting
/// an attempt (aborted handlers, abandoned claims, outcomes that could not
/// be written), trying until `deadline`. What cannot be released is logged
/// with its task ids; stuck-task recovery returns those after the timeout.
pub(super) async fn release_remaining(shared: &Shared, deadline: Instant) {
    let tokens = shared.holdings.all_tokens();
    if tokens.is_empty() {
        return;
    }
    let held = shared.holdings.held_ids();
    let mut outage = Outage::new("release");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            not_released(&held, "the flush deadline passed");
            return;
        }
        let result = call(
            &shared.engine,
            left.min(shared.deadline),
            "release",
            async |conn| crate::db::release_claims(conn, &tokens).await,
        )
        .await;
        match result {
            Ok(released) => {
                tracing::info!(released = ?released, "released this worker's unfinished tasks");
                shared.holdings.clear();
                return;
            }
            Err(error) if is_transient(&error) && Instant::now() < deadline => {
                let backoff = outage.failed(&error);
                tokio::time::sleep_until((Instant::now() + backoff).min(deadline)).await;
            }
            Err(error) => {
                not_released(&held, &error.to_string());
                return;
            }
        }
    }
}

/// Says what could not be released at exit, and why: an error when tasks
/// are known to be held, a warning when only claims whose answer never
/// arrived are left (they may have taken nothing).
fn not_released(held: &[i64], why: &str) {
    if held.is_empty() {
        tracing::warn!(
            why,
            "could not release the claims whose answer was lost; any task they took is \
             recovered after the heartbeat timeout"
        );
    } else {
        tracing::error!(
            task_ids = ?held,
            why,
            "could not release unfinished tasks before exit; stuck-task recovery will rerun \
             them after the heartbeat timeout"
        );
    }
}
