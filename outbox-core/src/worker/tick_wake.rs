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

use chrono::{DateTime, TimeDelta, Utc};
use tokio::task::JoinSet;

use super::Shared;
use crate::db::session::call;

/// How long after the tick (on the database's clock) the NOTIFY goes: the
/// claim that follows must see that clock at or past the tick.
const MARGIN: Duration = Duration::from_millis(5);

/// The leader's pending tick wake-ups.
#[derive(Default)]
pub(crate) struct TickWakeups {
    scheduled: HashSet<(String, DateTime<Utc>)>,
    /// Dropped with the leader's loop, which aborts them.
    timers: JoinSet<()>,
}

impl TickWakeups {
    /// Starts a timer for each upcoming tick that has none yet. `offset`
    /// is how far the database's clock is ahead of this machine's (read
    /// this round, by [`database_clock_offset`]): the claim compares a
    /// tick with the database's clock, so the timers go by it.
    pub(crate) fn schedule(&mut self, shared: &Arc<Shared>, offset: TimeDelta) {
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
            let wait = (tick - offset - now).to_std().unwrap_or_default() + MARGIN;
            let shared = Arc::clone(shared);
            self.timers.spawn(async move {
                tokio::time::sleep(wait).await;
                let woke = call(&shared.engine, shared.deadline, "periodic", async |conn| {
                    sqlx::query("SELECT pg_notify($1, $2)")
                        .bind(crate::db::NOTIFY_CHANNEL)
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

/// How far the database's clock is ahead of this machine's (negative when
/// behind), from one round trip, halved.
pub(crate) async fn database_clock_offset(shared: &Shared) -> sqlx::Result<TimeDelta> {
    let sent = Utc::now();
    let database: DateTime<Utc> = call(&shared.engine, shared.deadline, "periodic", async |conn| {
        sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(conn)
            .await
    })
    .await?;
    let back = Utc::now();
    Ok(database - (sent + (back - sent) / 2))
}
