//! A worker on a schema older than its build claims nothing until the
//! schema has caught up.
//!
//! Each build's statements call the functions of its own latest migration.
//! On an older schema one of them fails with "function does not exist", a
//! permanent error: an outcome statement that fails so would have a
//! success recorded as a failed attempt, and the task run again. The CLI's
//! `run` refuses such a schema outright. A library worker is often started
//! by the application itself, beside (or just before) the deploy step that
//! migrates, so it waits instead: its row, heartbeat and declarations go
//! on, and its claims, relays and maintenance start once the schema is at
//! least its build's. A schema ahead of the build (a newer build migrated
//! first) is fine: migrations keep what older builds call.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Shared;
use super::outage::Outage;
use crate::db::classify::is_transient;
use crate::db::session::call;
use crate::migrate::{applied_version, latest_version};

/// How often a worker waiting for a migration looks again.
const RECHECK: Duration = Duration::from_secs(1);

/// Waits until the database's schema is at least this build's; false if
/// `stop` came first.
pub(super) async fn wait(shared: &Shared, stop: &CancellationToken) -> bool {
    let needed = latest_version();
    let mut outage = Outage::new("schema check");
    let mut reported = None;
    loop {
        let check = call(
            &shared.engine,
            shared.deadline,
            "schema version",
            async |conn| applied_version(conn).await,
        );
        // A shutdown does not wait for a check a silent server holds up.
        let checked = tokio::select! {
            () = stop.cancelled() => return false,
            checked = check => checked,
        };
        let pause = match checked {
            Ok(current) if current >= needed => {
                outage.ok();
                if reported.is_some() {
                    tracing::info!(schema = current, "schema migrated: claiming");
                }
                return true;
            }
            Ok(current) => {
                outage.ok();
                if reported != Some(current) {
                    tracing::warn!(
                        schema = current,
                        needed,
                        "the database's schema is behind this build: claiming nothing until it \
                         is migrated (`outbox-worker migrate` or `outbox::migrate`)"
                    );
                    reported = Some(current);
                }
                RECHECK
            }
            // Not a moment's trouble (no right to read `outbox_migrations`,
            // say): the version cannot be known, so the worker runs as it
            // would without the check rather than never.
            Err(error) if !is_transient(&error) => {
                tracing::warn!(
                    %error,
                    "cannot read the schema's version; claiming without checking it"
                );
                return true;
            }
            Err(error) => outage.failed(&error).min(RECHECK),
        };
        tokio::select! {
            () = stop.cancelled() => return false,
            () = tokio::time::sleep(pause) => {}
        }
    }
}
