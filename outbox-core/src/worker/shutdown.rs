//! The end of a worker's run: handlers get their grace period, and
//! whatever the worker still holds is released, each step bounded whether
//! the database is up, down or silent.

use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use std::sync::Arc;

use super::Shared;
use super::outage::Outage;
use crate::db::{self, classify::is_transient, session::call};

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
    let result = release_until(shared, deadline, Release::Claims(&tokens)).await;
    match result {
        Ok(released) => {
            tracing::info!(released = ?released, "released this worker's unfinished tasks");
            shared.holdings.clear();
        }
        Err(why) => not_released(&held, &why),
    }
}

/// What a release puts back to PENDING.
pub(super) enum Release<'a> {
    /// Every task held under these claim tokens.
    Claims(&'a [Arc<str>]),
    /// Exactly these (task id, claim token) pairs.
    Tasks(&'a [(i64, Arc<str>)]),
}

/// Runs `release` until it succeeds, retrying transient errors with backoff
/// until `deadline`; returns the ids released, or why it gave up (a
/// permanent error, or the deadline).
pub(super) async fn release_until(
    shared: &Shared,
    deadline: Instant,
    release: Release<'_>,
) -> Result<Vec<i64>, String> {
    let mut outage = Outage::new("release");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("the deadline passed".to_owned());
        }
        let result = call(
            &shared.engine,
            left.min(shared.deadline),
            "release",
            async |conn| match release {
                Release::Claims(tokens) => db::release_claims(conn, tokens).await,
                Release::Tasks(tasks) => db::release_unstarted(conn, tasks).await,
            },
        )
        .await;
        match result {
            Ok(released) => return Ok(released),
            Err(error) if is_transient(&error) && Instant::now() < deadline => {
                let backoff = outage.failed(&error);
                tokio::time::sleep_until((Instant::now() + backoff).min(deadline)).await;
            }
            Err(error) => return Err(error.to_string()),
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
