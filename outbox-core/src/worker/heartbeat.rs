//! Keeps this worker's tasks alive: one UPDATE per interval for all of
//! them, so the cost does not grow with concurrency. "All of them" includes
//! tasks whose handler has returned but whose outcome is still waiting to
//! be written (the database may be away): they are still this worker's,
//! and recovery must not hand them to another worker meanwhile.
//!
//! Its answer also names held tasks an operator asked to cancel: the
//! fallback when the cancel's NOTIFY did not reach this worker.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Shared;
use super::outage::Outage;
use crate::db::{self, session::call};

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut outage = Outage::new("heartbeat");
    loop {
        tokio::select! {
            () = tokio::time::sleep(shared.config.heartbeat_interval) => {}
            () = stop.cancelled() => return,
        }
        let (ids, tokens) = shared.holdings.heartbeat_targets();
        if ids.is_empty() {
            continue;
        }
        shared.counters.heartbeat();
        let now = shared.config.clock.now();
        let beat = call(&shared.engine, shared.deadline, "heartbeat", async |conn| {
            db::heartbeat(conn, &ids, &tokens, now).await
        });
        let result = tokio::select! {
            r = beat => r,
            () = stop.cancelled() => return,
        };
        match result {
            Ok(cancel) => {
                outage.ok();
                // The fallback for a cancel whose NOTIFY this worker missed.
                for id in cancel {
                    if shared.holdings.request_cancel(id) {
                        tracing::info!(
                            task_id = id,
                            "cancel requested by an operator (seen by the heartbeat)"
                        );
                    }
                }
            }
            // The next interval tries again; recovery only steps in after
            // the (much longer) heartbeat timeout.
            Err(error) => {
                let _ = outage.failed(&error);
            }
        }
    }
}
