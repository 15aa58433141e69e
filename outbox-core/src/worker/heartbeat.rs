//! Keeps this worker's in-flight tasks alive: one UPDATE per interval for
//! all of them, so the cost does not grow with concurrency.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Shared;
use super::outage::Outage;
use crate::db;

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut outage = Outage::new("heartbeat");
    loop {
        tokio::select! {
            () = tokio::time::sleep(shared.config.heartbeat_interval) => {}
            () = stop.cancelled() => return,
        }
        let ids = shared.in_flight.ids();
        if ids.is_empty() {
            continue;
        }
        shared.counters.heartbeat();
        match db::heartbeat(
            &shared.pool,
            ids,
            &shared.config.worker_id,
            shared.config.clock.now(),
        )
        .await
        {
            Ok(_) => outage.ok(),
            // The next interval tries again; recovery only steps in after
            // the (much longer) heartbeat timeout.
            Err(error) => {
                let _ = outage.failed(&error);
            }
        }
    }
}
