//! Schema migrations: numbered SQL files from `migrations/`, embedded in the
//! binary, applied in order and recorded in `outbox_migrations`.
//!
//! Applying twice is a no-op, and two processes migrating at once are
//! serialised by a transaction-scoped advisory lock, so a fleet of workers
//! can all run `migrate` at start-up.

use std::time::{Duration, Instant};

use sqlx::{PgPool, Row};

use crate::db::classify::lock_wait_cut_short;
use crate::error::{Error, Result};

/// One embedded migration.
#[derive(Debug)]
pub struct Migration {
    /// Its number; migrations apply in increasing order.
    pub version: i64,
    /// A short name, from the file name.
    pub name: &'static str,
    /// The SQL that applies it.
    pub up: &'static str,
    /// The SQL that reverts it.
    pub down: &'static str,
}

/// Every migration this build knows, in order. Released entries are never
/// edited: a change is a new file.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "create_tasks",
        up: include_str!("../../migrations/0001_create_tasks.up.sql"),
        down: include_str!("../../migrations/0001_create_tasks.down.sql"),
    },
    Migration {
        version: 2,
        name: "leases",
        up: include_str!("../../migrations/0002_leases.up.sql"),
        down: include_str!("../../migrations/0002_leases.down.sql"),
    },
    Migration {
        version: 3,
        name: "throughput",
        up: include_str!("../../migrations/0003_throughput.up.sql"),
        down: include_str!("../../migrations/0003_throughput.down.sql"),
    },
    Migration {
        version: 4,
        name: "unique_tasks",
        up: include_str!("../../migrations/0004_unique_tasks.up.sql"),
        down: include_str!("../../migrations/0004_unique_tasks.down.sql"),
    },
    Migration {
        version: 5,
        name: "results",
        up: include_str!("../../migrations/0005_results.up.sql"),
        down: include_str!("../../migrations/0005_results.down.sql"),
    },
    Migration {
        version: 6,
        name: "cancel_running",
        up: include_str!("../../migrations/0006_cancel_running.up.sql"),
        down: include_str!("../../migrations/0006_cancel_running.down.sql"),
    },
    Migration {
        version: 7,
        name: "periodic",
        up: include_str!("../../migrations/0007_periodic.up.sql"),
        down: include_str!("../../migrations/0007_periodic.down.sql"),
    },
    Migration {
        version: 8,
        name: "ordering",
        up: include_str!("../../migrations/0008_ordering.up.sql"),
        down: include_str!("../../migrations/0008_ordering.down.sql"),
    },
    Migration {
        version: 9,
        name: "keyed_isolation",
        up: include_str!("../../migrations/0009_keyed_isolation.up.sql"),
        down: include_str!("../../migrations/0009_keyed_isolation.down.sql"),
    },
    Migration {
        version: 10,
        name: "history",
        up: include_str!("../../migrations/0010_history.up.sql"),
        down: include_str!("../../migrations/0010_history.down.sql"),
    },
    Migration {
        version: 11,
        name: "events",
        up: include_str!("../../migrations/0011_events.up.sql"),
        down: include_str!("../../migrations/0011_events.down.sql"),
    },
    Migration {
        version: 12,
        name: "event_log",
        up: include_str!("../../migrations/0012_event_log.up.sql"),
        down: include_str!("../../migrations/0012_event_log.down.sql"),
    },
    Migration {
        version: 13,
        name: "event_ids",
        up: include_str!("../../migrations/0013_event_ids.up.sql"),
        down: include_str!("../../migrations/0013_event_ids.down.sql"),
    },
    Migration {
        version: 14,
        name: "sql_api",
        up: include_str!("../../migrations/0014_sql_api.up.sql"),
        down: include_str!("../../migrations/0014_sql_api.down.sql"),
    },
    Migration {
        version: 15,
        name: "workflows",
        up: include_str!("../../migrations/0015_workflows.up.sql"),
        down: include_str!("../../migrations/0015_workflows.down.sql"),
    },
    Migration {
        version: 16,
        name: "trace_context",
        up: include_str!("../../migrations/0016_trace_context.up.sql"),
        down: include_str!("../../migrations/0016_trace_context.down.sql"),
    },
    Migration {
        version: 17,
        name: "hand_on",
        up: include_str!("../../migrations/0017_hand_on.up.sql"),
        down: include_str!("../../migrations/0017_hand_on.down.sql"),
    },
    Migration {
        version: 18,
        name: "claim_floor",
        up: include_str!("../../migrations/0018_claim_floor.up.sql"),
        down: include_str!("../../migrations/0018_claim_floor.down.sql"),
    },
    Migration {
        version: 19,
        name: "hand_over_plans",
        up: include_str!("../../migrations/0019_hand_over_plans.up.sql"),
        down: include_str!("../../migrations/0019_hand_over_plans.down.sql"),
    },
    Migration {
        version: 20,
        name: "log_maintenance_locks",
        up: include_str!("../../migrations/0020_log_maintenance_locks.up.sql"),
        down: include_str!("../../migrations/0020_log_maintenance_locks.down.sql"),
    },
    Migration {
        version: 21,
        name: "workflow_step_writes",
        up: include_str!("../../migrations/0021_workflow_step_writes.up.sql"),
        down: include_str!("../../migrations/0021_workflow_step_writes.down.sql"),
    },
    Migration {
        version: 22,
        name: "outcome_lanes",
        up: include_str!("../../migrations/0022_outcome_lanes.up.sql"),
        down: include_str!("../../migrations/0022_outcome_lanes.down.sql"),
    },
    Migration {
        version: 23,
        name: "key_try_lock",
        up: include_str!("../../migrations/0023_key_try_lock.up.sql"),
        down: include_str!("../../migrations/0023_key_try_lock.down.sql"),
    },
    Migration {
        version: 24,
        name: "workflow_hot_updates",
        up: include_str!("../../migrations/0024_workflow_hot_updates.up.sql"),
        down: include_str!("../../migrations/0024_workflow_hot_updates.down.sql"),
    },
    Migration {
        version: 25,
        name: "workflow_lookups",
        up: include_str!("../../migrations/0025_workflow_lookups.up.sql"),
        down: include_str!("../../migrations/0025_workflow_lookups.down.sql"),
    },
    Migration {
        version: 26,
        name: "outcome_plans",
        up: include_str!("../../migrations/0026_outcome_plans.up.sql"),
        down: include_str!("../../migrations/0026_outcome_plans.down.sql"),
    },
    Migration {
        version: 27,
        name: "lookups_by_id",
        up: include_str!("../../migrations/0027_lookups_by_id.up.sql"),
        down: include_str!("../../migrations/0027_lookups_by_id.down.sql"),
    },
    Migration {
        version: 28,
        name: "key_runs",
        up: include_str!("../../migrations/0028_key_runs.up.sql"),
        down: include_str!("../../migrations/0028_key_runs.down.sql"),
    },
    Migration {
        version: 29,
        name: "cancelled_outcomes",
        up: include_str!("../../migrations/0029_cancelled_outcomes.up.sql"),
        down: include_str!("../../migrations/0029_cancelled_outcomes.down.sql"),
    },
    Migration {
        version: 30,
        name: "cancelled_attempts",
        up: include_str!("../../migrations/0030_cancelled_attempts.up.sql"),
        down: include_str!("../../migrations/0030_cancelled_attempts.down.sql"),
    },
    Migration {
        version: 31,
        name: "intake",
        up: include_str!("../../migrations/0031_intake.up.sql"),
        down: include_str!("../../migrations/0031_intake.down.sql"),
    },
    Migration {
        version: 32,
        name: "workflow_cancel_mark",
        up: include_str!("../../migrations/0032_workflow_cancel_mark.up.sql"),
        down: include_str!("../../migrations/0032_workflow_cancel_mark.down.sql"),
    },
    Migration {
        version: 33,
        name: "claim_moves",
        up: include_str!("../../migrations/0033_claim_moves.up.sql"),
        down: include_str!("../../migrations/0033_claim_moves.down.sql"),
    },
    Migration {
        version: 34,
        name: "run_lock_by_id",
        up: include_str!("../../migrations/0034_run_lock_by_id.up.sql"),
        down: include_str!("../../migrations/0034_run_lock_by_id.down.sql"),
    },
    Migration {
        version: 35,
        name: "claim_fronts",
        up: include_str!("../../migrations/0035_claim_fronts.up.sql"),
        down: include_str!("../../migrations/0035_claim_fronts.down.sql"),
    },
    Migration {
        version: 36,
        name: "outcome_sets",
        up: include_str!("../../migrations/0036_outcome_sets.up.sql"),
        down: include_str!("../../migrations/0036_outcome_sets.down.sql"),
    },
    Migration {
        version: 37,
        name: "parked_heads",
        up: include_str!("../../migrations/0037_parked_heads.up.sql"),
        down: include_str!("../../migrations/0037_parked_heads.down.sql"),
    },
    Migration {
        version: 38,
        name: "event_id_digest",
        up: include_str!("../../migrations/0038_event_id_digest.up.sql"),
        down: include_str!("../../migrations/0038_event_id_digest.down.sql"),
    },
    Migration {
        version: 39,
        name: "relay_failing",
        up: include_str!("../../migrations/0039_relay_failing.up.sql"),
        down: include_str!("../../migrations/0039_relay_failing.down.sql"),
    },
    Migration {
        version: 40,
        name: "sql_emit_once_digest",
        up: include_str!("../../migrations/0040_sql_emit_once_digest.up.sql"),
        down: include_str!("../../migrations/0040_sql_emit_once_digest.down.sql"),
    },
    Migration {
        version: 41,
        name: "plain_outcomes",
        up: include_str!("../../migrations/0041_plain_outcomes.up.sql"),
        down: include_str!("../../migrations/0041_plain_outcomes.down.sql"),
    },
    Migration {
        version: 42,
        name: "sql_emit_traceparent",
        up: include_str!("../../migrations/0042_sql_emit_traceparent.up.sql"),
        down: include_str!("../../migrations/0042_sql_emit_traceparent.down.sql"),
    },
    Migration {
        version: 43,
        name: "runs_held_in_place",
        up: include_str!("../../migrations/0043_runs_held_in_place.up.sql"),
        down: include_str!("../../migrations/0043_runs_held_in_place.down.sql"),
    },
    Migration {
        version: 44,
        name: "task_pages_room_for_runs",
        up: include_str!("../../migrations/0044_task_pages_room_for_runs.up.sql"),
        down: include_str!("../../migrations/0044_task_pages_room_for_runs.down.sql"),
    },
    Migration {
        version: 45,
        name: "sql_submit_empty_unique_key",
        up: include_str!("../../migrations/0045_sql_submit_empty_unique_key.up.sql"),
        down: include_str!("../../migrations/0045_sql_submit_empty_unique_key.down.sql"),
    },
    Migration {
        version: 46,
        name: "key_runs_handed_on",
        up: include_str!("../../migrations/0046_key_runs_handed_on.up.sql"),
        down: include_str!("../../migrations/0046_key_runs_handed_on.down.sql"),
    },
    Migration {
        version: 47,
        name: "sql_submit_max_attempts",
        up: include_str!("../../migrations/0047_sql_submit_max_attempts.up.sql"),
        down: include_str!("../../migrations/0047_sql_submit_max_attempts.down.sql"),
    },
    Migration {
        version: 48,
        name: "cancelled_steps_that_succeed",
        up: include_str!("../../migrations/0048_cancelled_steps_that_succeed.up.sql"),
        down: include_str!("../../migrations/0048_cancelled_steps_that_succeed.down.sql"),
    },
    Migration {
        version: 49,
        name: "sql_signal",
        up: include_str!("../../migrations/0049_sql_signal.up.sql"),
        down: include_str!("../../migrations/0049_sql_signal.down.sql"),
    },
    Migration {
        version: 50,
        name: "key_places_in_order",
        up: include_str!("../../migrations/0050_key_places_in_order.up.sql"),
        down: include_str!("../../migrations/0050_key_places_in_order.down.sql"),
    },
    Migration {
        version: 51,
        name: "leader_settings",
        up: include_str!("../../migrations/0051_leader_settings.up.sql"),
        down: include_str!("../../migrations/0051_leader_settings.down.sql"),
    },
    Migration {
        version: 52,
        name: "subscription_sinks",
        up: include_str!("../../migrations/0052_subscription_sinks.up.sql"),
        down: include_str!("../../migrations/0052_subscription_sinks.down.sql"),
    },
    Migration {
        version: 53,
        name: "sql_emit_null_payload",
        up: include_str!("../../migrations/0053_sql_emit_null_payload.up.sql"),
        down: include_str!("../../migrations/0053_sql_emit_null_payload.down.sql"),
    },
    Migration {
        version: 54,
        name: "sql_submit_messages",
        up: include_str!("../../migrations/0054_sql_submit_messages.up.sql"),
        down: include_str!("../../migrations/0054_sql_submit_messages.down.sql"),
    },
    Migration {
        version: 55,
        name: "run_starts_joined",
        up: include_str!("../../migrations/0055_run_starts_joined.up.sql"),
        down: include_str!("../../migrations/0055_run_starts_joined.down.sql"),
    },
    Migration {
        version: 56,
        name: "runs_held_unwritten",
        up: include_str!("../../migrations/0056_runs_held_unwritten.up.sql"),
        down: include_str!("../../migrations/0056_runs_held_unwritten.down.sql"),
    },
];

/// Released migrations whose text was edited after release, by the
/// checksum of each earlier text (a mistake not to repeat: a change is a
/// new file). A database that applied an earlier text, and nothing after
/// it, has the current text applied over it and its record updated,
/// rather than being refused for good: each current text here applies
/// cleanly over its earlier ones. Migration 40 gained
/// `outbox_event_digest` and the nil-UUID check after builds 7aa706c to
/// ae25e2e had applied it.
const SUPERSEDED: &[(i64, &str)] = &[(40, "9fa93177cece1957"), (40, "47f756abf5636471")];

/// An arbitrary constant that names the "outbox migration" advisory lock.
const MIGRATION_LOCK_KEY: i64 = 0x6f75_7462_6f78_0001;

/// What `migrate` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Versions applied by this call, in order (empty when up to date).
    pub applied: Vec<i64>,
    /// The schema version after the call.
    pub current: i64,
}

/// The schema version in the database compared with this build's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaStatus {
    /// The highest applied version (0 for an empty database).
    pub current: i64,
    /// The highest version this build knows.
    pub latest: i64,
}

impl SchemaStatus {
    /// True when the database has every migration this build knows.
    pub fn is_up_to_date(&self) -> bool {
        self.current >= self.latest
    }
}

/// The highest migration version this build knows.
pub fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// How a migration waits for the table locks its statements take.
///
/// A statement that alters a table waits for every transaction using it,
/// and while it waits every later statement on that table (claims,
/// submits, outcomes) queues behind it: one long transaction elsewhere
/// would hold the whole outbox up for as long as it stays open. So each
/// lock is waited for at most `lock_timeout`; a migration that times out is
/// rolled back whole (nothing half-applied), and tried again after a pause
/// (at least `lock_timeout`) until `retry_for` has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrateOptions {
    /// The longest any statement waits for a lock (PostgreSQL's
    /// `lock_timeout`), so the longest the outbox's own statements queue
    /// behind a migration's wait (a migration that has its locks holds
    /// them while it runs). Default 2 s.
    pub lock_timeout: Duration,
    /// How long, from the call, to keep trying after a lock wait timed out
    /// before giving up, changing nothing. Default 60 s.
    pub retry_for: Duration,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        Self {
            lock_timeout: Duration::from_secs(2),
            retry_for: Duration::from_secs(60),
        }
    }
}

/// Applies every pending migration in one transaction, with the default
/// [`MigrateOptions`].
///
/// Fails without changing anything when the database holds a migration this
/// build does not know (it was migrated by a newer version), when an
/// applied migration's text differs from this build's (it was edited), or
/// when the locks it needs stayed held for `retry_for`.
pub async fn migrate(pool: &PgPool) -> Result<MigrationReport> {
    migrate_with(pool, latest_version(), MigrateOptions::default()).await
}

/// [`migrate`], but only the pending migrations up to version `target`:
/// for rolling an upgrade out in steps, and for testing an upgrade from an
/// older schema. A `target` below the current version changes nothing
/// (migrations are not reverted).
pub async fn migrate_to(pool: &PgPool, target: i64) -> Result<MigrationReport> {
    migrate_with(pool, target, MigrateOptions::default()).await
}

/// [`migrate_to`] with the lock waits of `options`.
///
/// One transaction holds the migration lock for all the tries, pauses
/// included, each try undone to a savepoint: another `migrate` meanwhile
/// (a fleet starting at once) waits for it, then finds the schema migrated
/// or tries on its own, rather than take turns at the tables and keep them
/// blocked. The same holds through a transaction-mode pooler, which keeps
/// a transaction on one server session. Each try applies every pending
/// migration from the first, and holds the locks it took until it commits
/// or is undone. Once a try has written anything the transaction keeps its
/// id until the end, which holds vacuum back like any open transaction:
/// keep `retry_for` short.
pub async fn migrate_with(
    pool: &PgPool,
    target: i64,
    options: MigrateOptions,
) -> Result<MigrationReport> {
    if options.lock_timeout < Duration::from_millis(1)
        || options.lock_timeout > Duration::from_secs(3600)
    {
        return Err(Error::InvalidOption(format!(
            "lock_timeout {:?} is out of range: use 1ms to 1h",
            options.lock_timeout
        )));
    }
    // The budget counts from the call: time spent waiting for another
    // `migrate` to finish is part of it.
    let started = Instant::now();
    let mut tx = crate::pooler::begin(pool).await?;
    sqlx::query(include_str!("db/sql/lock_migrations.sql"))
        .bind(MIGRATION_LOCK_KEY)
        .execute(&mut *tx)
        .await?;
    // Set after the advisory lock: another `migrate` holding that one may
    // take as long as its migrations do.
    sqlx::query(include_str!("db/sql/set_lock_timeout.sql"))
        .bind(format!("{}ms", options.lock_timeout.as_millis()))
        .execute(&mut *tx)
        .await?;
    let mut waits = 0u32;
    // Made once: rolling back to it leaves it in place, empty, for the next
    // try (a new one each try would nest a level per try).
    sqlx::raw_sql("SAVEPOINT outbox_migrate")
        .execute(&mut *tx)
        .await?;
    loop {
        match attempt(&mut tx, target).await {
            Ok(report) => {
                tx.commit().await?;
                return Ok(report);
            }
            Err(Failed::Other(error)) => return Err(error),
            Err(Failed::Locked { what, error }) => {
                // Undoes the try and lets go of the table locks it took;
                // the migration lock, taken before, stays.
                sqlx::raw_sql("ROLLBACK TO SAVEPOINT outbox_migrate")
                    .execute(&mut *tx)
                    .await?;
                waits += 1;
                // At least as long as a wait, so the table is free at least
                // half of the time while this retries.
                let pause = retry_pause(waits).max(options.lock_timeout);
                if started.elapsed() + pause >= options.retry_for {
                    return Err(Error::Migration(format!(
                        "{what} waited for a lock {waits} time(s) over {:.0?} ({:?} each) and \
                         was given up, changing nothing: a transaction holds a table it alters \
                         (look in pg_stat_activity for an old xact_start), end it or migrate at \
                         a quieter moment; the last wait: {error}",
                        started.elapsed(),
                        options.lock_timeout,
                    )));
                }
                tracing::warn!(
                    what,
                    waits,
                    %error,
                    "a migration's lock is held elsewhere; rolled back, trying again"
                );
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// The pause after the `waits`-th lock wait: 250 ms doubling to 4 s, long
/// enough for the statements that queued behind the wait to get through.
fn retry_pause(waits: u32) -> Duration {
    Duration::from_millis(250 << waits.saturating_sub(1).min(4))
}

/// Why one attempt at migrating failed.
enum Failed {
    /// A lock wait timed out (or a deadlock was broken): worth another try.
    /// `what` waited: a migration, or the bookkeeping around them.
    Locked {
        what: String,
        error: sqlx::Error,
    },
    Other(Error),
}

impl From<sqlx::Error> for Failed {
    fn from(error: sqlx::Error) -> Self {
        if lock_wait_cut_short(&error) {
            Failed::Locked {
                what: "the record of applied migrations (outbox_migrations)".to_owned(),
                error,
            }
        } else {
            Failed::Other(error.into())
        }
    }
}

impl From<Error> for Failed {
    fn from(error: Error) -> Self {
        Failed::Other(error)
    }
}

/// One try at applying the pending migrations up to `target` in `tx`,
/// which holds the migration lock (left for the caller to commit).
async fn attempt(
    tx: &mut sqlx::PgTransaction<'_>,
    target: i64,
) -> std::result::Result<MigrationReport, Failed> {
    // Created only when missing (the lock above keeps others out): an
    // IF NOT EXISTS on every run has the server send a notice, which sqlx
    // logs, each time `migrate` finds the schema up to date.
    let exists: bool = sqlx::query_scalar(include_str!("db/sql/migrations_table_exists.sql"))
        .fetch_one(&mut **tx)
        .await?;
    if !exists {
        sqlx::query(include_str!("db/sql/create_migrations_table.sql"))
            .execute(&mut **tx)
            .await?;
    }
    let rows = sqlx::query(include_str!("db/sql/select_migrations.sql"))
        .fetch_all(&mut **tx)
        .await?;
    let mut applied_before = Vec::with_capacity(rows.len());
    let mut superseded = Vec::new();
    for row in &rows {
        let version: i64 = row.try_get("version")?;
        let checksum: String = row.try_get("checksum")?;
        match MIGRATIONS.iter().find(|m| m.version == version) {
            None => {
                return Err(Error::Migration(format!(
                    "the database has migration {version}, which this build does not know \
                     (it knows up to {}); run a newer outbox build",
                    latest_version()
                ))
                .into());
            }
            Some(m) if SUPERSEDED.contains(&(version, checksum.as_str())) => {
                superseded.push(m);
                applied_before.push(version);
            }
            Some(m) if checksum != checksum_of(m.up) => {
                return Err(Failed::Other(Error::Migration(format!(
                    "migration {version} ({}) applied to the database differs from this build's; \
                     released migrations must never be edited",
                    m.name
                ))));
            }
            Some(_) => applied_before.push(version),
        }
    }
    // The migrations' notices ("... does not exist, skipping" from their
    // IF EXISTS clauses) are noise to whoever runs them; warnings stay.
    sqlx::raw_sql("SET LOCAL client_min_messages = warning")
        .execute(&mut **tx)
        .await?;
    for m in superseded {
        // Only over a database that applied nothing after it: the current
        // text would otherwise undo what later migrations replaced.
        if let Some(later) = applied_before.iter().find(|&&v| v > m.version) {
            return Err(Failed::Other(Error::Migration(format!(
                "migration {} ({}) applied to the database is an earlier text of this \
                 build's, and migration {later} was applied after it: it cannot be brought up \
                 to date in place",
                m.version, m.name
            ))));
        }
        sqlx::raw_sql(m.up).execute(&mut **tx).await.map_err(|error| {
            Error::Migration(format!(
                "migration {} ({}): applying this build's text over the earlier one failed: {error}",
                m.version, m.name
            ))
        })?;
        sqlx::query("UPDATE outbox_migrations SET checksum = $1 WHERE version = $2")
            .bind(checksum_of(m.up))
            .bind(m.version)
            .execute(&mut **tx)
            .await?;
        tracing::info!(
            version = m.version,
            "brought migration {} ({}) up to this build's text (it was edited after release)",
            m.version,
            m.name
        );
    }
    let mut applied = Vec::new();
    for m in MIGRATIONS
        .iter()
        .filter(|m| m.version <= target && !applied_before.contains(&m.version))
    {
        sqlx::raw_sql(m.up)
            .execute(&mut **tx)
            .await
            .map_err(|error| {
                if lock_wait_cut_short(&error) {
                    Failed::Locked {
                        what: format!("migration {} ({})", m.version, m.name),
                        error,
                    }
                } else {
                    let what = format!("migration {} ({}) failed: {error}", m.version, m.name);
                    Error::Migration(what).into()
                }
            })?;
        sqlx::query(include_str!("db/sql/insert_migration.sql"))
            .bind(m.version)
            .bind(m.name)
            .bind(checksum_of(m.up))
            .execute(&mut **tx)
            .await?;
        applied.push(m.version);
    }
    let current = applied_before
        .iter()
        .chain(&applied)
        .copied()
        .max()
        .unwrap_or(0);
    Ok(MigrationReport { applied, current })
}

/// Reads the schema version without changing anything.
pub async fn schema_status(pool: &PgPool) -> Result<SchemaStatus> {
    let current = crate::pooler::on(pool, async |conn| applied_version(conn).await).await?;
    Ok(SchemaStatus {
        current,
        latest: latest_version(),
    })
}

/// The highest migration applied on `conn`'s database, 0 before the first.
pub(crate) async fn applied_version(conn: &mut sqlx::PgConnection) -> sqlx::Result<i64> {
    let exists: bool = sqlx::query_scalar(include_str!("db/sql/migrations_table_exists.sql"))
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(0);
    }
    sqlx::query_scalar(include_str!("db/sql/schema_version.sql"))
        .fetch_one(&mut *conn)
        .await
}

/// FNV-1a over the SQL text: enough to notice an edited migration.
fn checksum_of(sql: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in sql.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order_from_one() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(
                m.version,
                i as i64 + 1,
                "migration {} is out of sequence",
                m.name
            );
            assert!(!m.up.trim().is_empty() && !m.down.trim().is_empty());
        }
    }

    #[test]
    fn lock_waits_pause_longer_each_time_up_to_four_seconds() {
        let pauses: Vec<u128> = (1..=7).map(|n| retry_pause(n).as_millis()).collect();
        assert_eq!(pauses, [250, 500, 1000, 2000, 4000, 4000, 4000]);
        assert_eq!(retry_pause(u32::MAX).as_millis(), 4000);
    }

    #[test]
    fn a_superseded_text_is_never_a_current_one() {
        for (version, checksum) in SUPERSEDED {
            let m = MIGRATIONS.iter().find(|m| m.version == *version).unwrap();
            assert_ne!(checksum_of(m.up), *checksum, "migration {version}");
        }
    }

    #[test]
    fn checksum_tells_edits_apart() {
        assert_eq!(checksum_of("a"), checksum_of("a"));
        assert_ne!(checksum_of("a"), checksum_of("b"));
    }
}
