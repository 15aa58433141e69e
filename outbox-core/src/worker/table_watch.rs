//! The maintenance leader's eye on the task table: a snapshot held open for
//! long by any session of the database (an idle transaction, a long
//! report, a forgotten `BEGIN` in psql) keeps vacuum from removing the row
//! versions every claim and outcome leaves behind, and every SKIP LOCKED
//! claim then steps over more of them. Nothing in the engine can end such
//! a transaction; it can say so, with the session's pid, before the queue
//! slows down.

use std::time::{Duration, Instant};

use super::Shared;
use crate::db::session::call;

/// How often the leader looks.
const CHECK_EVERY: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(super) struct TableWatch {
    checked_at: Option<Instant>,
}

impl TableWatch {
    /// Looks at most once a [`CHECK_EVERY`], and warns while the oldest
    /// snapshot is older than `snapshot_age_warning`. Best effort: a failed
    /// look is tried again next time and fails nothing else.
    pub(super) async fn check(&mut self, shared: &Shared) {
        if self.checked_at.is_some_and(|t| t.elapsed() < CHECK_EVERY) {
            return;
        }
        self.checked_at = Some(Instant::now());
        let health = call(
            &shared.engine,
            shared.deadline,
            "table health",
            async |conn| crate::db::admin::table_health(conn).await,
        )
        .await;
        let health = match health {
            Ok(h) => h,
            Err(error) => {
                tracing::debug!(%error, "could not read the task table's health");
                return;
            }
        };
        let limit = shared.config.snapshot_age_warning;
        if health.oldest_snapshot_age_s > limit.as_secs_f64() {
            tracing::warn!(
                age_s = health.oldest_snapshot_age_s.round(),
                holder = health
                    .oldest_snapshot_holder
                    .as_deref()
                    .unwrap_or("unknown"),
                dead_tuples = health.dead_tuples,
                live_tuples = health.live_tuples,
                "a transaction has held a snapshot for longer than {limit:?}: vacuum cannot \
                 clear the task table's dead rows meanwhile, and claims slow down; end it \
                 (pg_terminate_backend) or make it shorter"
            );
        }
    }
}
