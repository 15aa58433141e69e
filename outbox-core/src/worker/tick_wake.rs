//! The maintenance leader wakes a periodic task's queue at each tick.
//!
//! Ticks are enqueued ahead, due at their time; without a wake-up a worker
//! would find one only at its next poll (a second by default). So the
//! leader keeps a timer for every tick within the horizon and sends the
//! queue's NOTIFY when it comes, the same NOTIFY a submit sends. A timer
//! that fails, or a leader that dies, only costs that tick its promptness:
//! the poll still finds it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinSet;

use super::Shared;
use crate::db::session::call;

/// How long after the tick the NOTIFY goes: the claim that follows must see
/// the database's clock at or past the tick.
const MARGIN: Duration = Duration::from_millis(5);

/// The leader's pending tick wake-ups.
#[derive(Default)]
pub(crate) struct TickWakeups {
    scheduled: HashSet<(String, DateTime<Utc>)>,
    /// Dropped with the leader's loop, which aborts them.
    timers: JoinSet<()>,
}

impl TickWakeups {
    /// Starts a timer for each upcoming tick that has none yet.
    pub(crate) fn schedule(&mut self, shared: &Arc<Shared>) {
        // A fixed test clock has no real instants to wait for.
        if shared.periodic.is_empty() || shared.config.clock.now().is_some() {
            return;
        }
        while self.timers.try_join_next().is_some() {}
        let now = Utc::now();
        self.scheduled.retain(|(_, tick)| *tick > now);
        let round = shared.config.maintenance_interval;
        for (queue, tick) in crate::periodic::upcoming(&shared.periodic, now, round) {
            if !self.scheduled.insert((queue.clone(), tick)) {
                continue;
            }
            let wait = (tick - now).to_std().unwrap_or_default() + MARGIN;
            let shared = Arc::clone(shared);
            self.timers.spawn(async move {
                tokio::time::sleep(wait).await;
                let woke = call(&shared.engine, shared.deadline, "periodic", async |conn| {
                    sqlx::query("SELECT pg_notify('outbox_tasks', $1)")
                        .bind(&queue)
                        .execute(conn)
                        .await
                        .map(|_| ())
                })
                .await;
                if let Err(error) = woke {
                    tracing::debug!(%error, %queue, "could not wake the queue at its periodic tick; its poll will");
                }
            });
        }
    }
}
