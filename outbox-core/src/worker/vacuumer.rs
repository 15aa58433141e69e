//! The maintenance leader vacuums the task table when dead row versions pile
//! up, rather than waiting for autovacuum.
//!
//! Every claim leaves the task's entry in the claim index pointing at a dead
//! row version, at the front of the index (the oldest due tasks first), and
//! every later claim walks over those entries until a vacuum removes them:
//! a drain slows down as it goes. Autovacuum visits a database at most once
//! a minute (`autovacuum_naptime`), in which a busy queue leaves a million
//! of them. Since the history lives in another table, `outbox_tasks` holds
//! live tasks only and a vacuum of it is quick; the leader runs one when the
//! statistics show more dead versions than [`WorkerConfig::vacuum_threshold`]
//! (and than a tenth of the live rows: a vacuum scans every index whole, so
//! a large table waits for more), one at a time, beside its maintenance
//! round.
//! Dead versions a vacuum could not remove (an old snapshot still sees
//! them) do not count towards the next one, or the leader would vacuum in
//! vain every round while a long transaction lasts.
//!
//! [`WorkerConfig::vacuum_threshold`]: crate::WorkerConfig::vacuum_threshold

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::Shared;
use crate::db::session::{CLIENT_MARGIN, call};

/// The most a vacuum may take; a table that needs longer is left to
/// autovacuum. (It holds SHARE UPDATE EXCLUSIVE on the table meanwhile,
/// which a deploy's `ALTER TABLE` would wait for.)
const VACUUM_TIMEOUT: Duration = Duration::from_secs(60);

/// One vacuum at a time, in the background of the maintainer.
#[derive(Default)]
pub(super) struct Vacuumer {
    running: Option<JoinHandle<()>>,
    /// Dead versions the last vacuum left behind.
    left: Arc<AtomicU64>,
}

impl Vacuumer {
    /// Starts a vacuum if one is due and none is running. Best effort: a
    /// failed look or vacuum is logged and tried again next round.
    pub(super) async fn check(&mut self, shared: &Arc<Shared>) {
        let threshold = shared.config.vacuum_threshold;
        // VACUUM cannot run inside a transaction, which is all a pooler in
        // transaction mode lets the engine have: autovacuum does it then.
        if threshold == 0
            || shared.engine.pooled()
            || self.running.as_ref().is_some_and(|r| !r.is_finished())
        {
            return;
        }
        let due = call(&shared.engine, shared.deadline, "vacuum", async |conn| {
            crate::db::admin::vacuum_due(conn).await
        })
        .await;
        let (dead, live, may) = match due {
            Ok(due) => due,
            Err(error) => {
                tracing::debug!(%error, "could not read the task table's dead rows");
                return;
            }
        };
        let dead = u64::try_from(dead).unwrap_or(0);
        let live = u64::try_from(live).unwrap_or(0);
        let left = self.left.load(Ordering::Relaxed);
        if !may || dead < threshold.max(live / 10).saturating_add(left) {
            return;
        }
        let shared = Arc::clone(shared);
        let left = Arc::clone(&self.left);
        self.running = Some(tokio::spawn(async move {
            let timeout = shared.config.statement_timeout;
            let started = std::time::Instant::now();
            let done = call(
                &shared.engine,
                VACUUM_TIMEOUT + CLIENT_MARGIN,
                "vacuum",
                async |conn| {
                    crate::db::admin::vacuum_tasks(conn, VACUUM_TIMEOUT, timeout).await?;
                    crate::db::admin::vacuum_due(conn).await
                },
            )
            .await;
            match done {
                Ok((remaining, _, _)) => {
                    left.store(u64::try_from(remaining).unwrap_or(0), Ordering::Relaxed);
                    tracing::debug!(
                        dead,
                        live,
                        remaining,
                        elapsed = ?started.elapsed(),
                        "vacuumed the task table"
                    );
                }
                Err(error) => {
                    tracing::info!(%error, dead, "could not vacuum the task table; autovacuum will");
                }
            }
        }));
    }
}

impl Drop for Vacuumer {
    fn drop(&mut self) {
        // The maintainer is stopping: so does its vacuum. The server ends
        // the statement within a second of its connection closing where it
        // checks (client_connection_check_interval, PostgreSQL 14 and
        // later), and at its statement timeout otherwise.
        if let Some(running) = self.running.take() {
            running.abort();
        }
    }
}
