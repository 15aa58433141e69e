//! Runs maintenance (stuck-task recovery, cleanup) on one worker of the
//! cluster at a time.
//!
//! The leader holds a lease (a row in `outbox_leases`) that runs out on the
//! database's clock unless renewed. Every worker tries to take or renew it
//! once per maintenance interval; the holder renews it and runs
//! maintenance. A leader that dies, or goes silent behind a half-open
//! connection, stops renewing, and another worker takes over once the
//! lease has run out: within [`lease_ttl`] plus one interval. Recovery is
//! fenced on the lease, so a silent leader that wakes up cannot act on what
//! it saw before.
//!
//! When the database comes back from an outage, every worker's heartbeats
//! are stale at once, through no fault of theirs. So recovery waits two
//! heartbeat intervals after this worker starts or regains the database,
//! long enough for every worker that was cut off with it to report its
//! tasks alive; otherwise an outage longer than the heartbeat timeout would
//! hand live tasks to a second worker.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::outage::Outage;
use super::table_watch::TableWatch;
use super::vacuumer::Vacuumer;
use crate::db::{self, session::call};
use crate::maintenance::{DEFAULT_BATCH, cleanup_completed_us, recover_stuck_as};
use crate::options::delay_micros;

/// The name of the maintenance leader's lease in `outbox_leases`.
pub const MAINTENANCE_LEASE: &str = "maintenance";

/// How long a lease lasts when not renewed: two maintenance intervals (so
/// one slow renewal does not lose it), and at least a second.
pub(crate) fn lease_ttl(interval: Duration) -> Duration {
    (interval * 2).max(Duration::from_secs(1))
}

/// A shutdown hands the lease over with this much patience at most.
const RESIGN_DEADLINE: Duration = Duration::from_secs(1);

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let interval = shared.config.maintenance_interval;
    let ttl_us = delay_micros(lease_ttl(interval)).unwrap_or(i64::MAX);
    let holder = shared.holdings.run_id().to_owned();
    let settings = super::leader_settings::of(&shared.config);
    let mut outage = Outage::new("maintenance");
    let mut leading = false;
    let mut declared = false;
    let mut last_cleanup: Option<Instant> = None;
    let mut watch = TableWatch::default();
    let mut vacuumer = Vacuumer::default();
    let mut wakeups = super::tick_wake::TickWakeups::default();
    let mut follower = FollowerCheck::default();
    let settle = shared.config.heartbeat_interval * 2;
    // Since when this worker has reached the database without a failure.
    let mut reachable_since = Some(Instant::now());
    loop {
        // Rounds start at a fixed rate (not an interval after the last one
        // ended), so a slow round does not delay the next renewal.
        let round = Instant::now();
        let renew = call(&shared.engine, shared.deadline, "lease", async |conn| {
            db::acquire_lease(conn, MAINTENANCE_LEASE, &holder, ttl_us, Some(&settings)).await
        });
        let held = tokio::select! {
            r = renew => r,
            () = stop.cancelled() => break,
        };
        let mut wait = interval;
        match held {
            Ok(Some(began)) => {
                outage.ok();
                let since = *reachable_since.get_or_insert_with(Instant::now);
                if !leading {
                    tracing::info!(
                        worker_id = %shared.config.worker_id,
                        run_id = %holder,
                        %settings,
                        "elected maintenance leader"
                    );
                    leading = true;
                    declared = false;
                } else if began {
                    // Its lease ran out before this renewal: a leadership
                    // begins again, and declares again (an operator may
                    // have deleted a declaration meanwhile, judging that no
                    // leader declared it).
                    tracing::info!("took the maintenance lease back after it ran out");
                    declared = false;
                }
                let recover = since.elapsed() >= settle;
                let work = async {
                    if !declared && !shared.periodic.is_empty() {
                        declare_periodic(&shared).await?;
                        declared = true;
                    }
                    // A failed enqueue must not hold back recovery and
                    // cleanup; the next round tries again.
                    match enqueue_periodic(&shared, &holder).await {
                        Ok(offset) => wakeups.schedule(&shared, offset),
                        // An outage is reported once, by the rest of the
                        // round; anything else is worth a warning.
                        Err(error) if crate::db::classify::is_transient(&error) => {
                            tracing::debug!(%error, "could not enqueue periodic ticks; trying again next round");
                        }
                        Err(error) => {
                            tracing::warn!(%error, "could not enqueue periodic ticks; trying again next round");
                        }
                    }
                    watch.check(&shared).await;
                    vacuumer.check(&shared).await;
                    maintain(&shared, &holder, recover, &mut last_cleanup).await
                };
                match tokio::select! { r = work => r, () = stop.cancelled() => break } {
                    Ok(()) => {}
                    Err(error) => {
                        reachable_since = None;
                        wait = wait.min(outage.failed(&error));
                    }
                }
            }
            Ok(None) => {
                outage.ok();
                reachable_since.get_or_insert_with(Instant::now);
                if leading {
                    tracing::warn!(
                        "another worker took over maintenance (this one's lease ran out)"
                    );
                    leading = false;
                }
                let check = follower.check(&shared, &settings);
                tokio::select! {
                    () = check => {}
                    () = stop.cancelled() => break,
                }
            }
            Err(error) => {
                reachable_since = None;
                wait = wait.min(outage.failed(&error));
            }
        }
        let next = if wait < interval {
            Instant::now() + wait
        } else {
            round + interval
        };
        tokio::select! {
            () = tokio::time::sleep_until(next.into()) => {}
            () = stop.cancelled() => break,
        }
    }
    if leading {
        let resign = call(&shared.engine, RESIGN_DEADLINE, "lease", async |conn| {
            db::release_lease(conn, MAINTENANCE_LEASE, &holder).await
        });
        if let Err(error) = resign.await {
            tracing::info!(%error, "could not hand the maintenance lease over; it runs out by itself");
        }
    }
}

/// How often a worker that does not lead checks that the leader declares
/// its periodic tasks and applies its maintenance settings.
const FOLLOWER_CHECK_EVERY: Duration = Duration::from_secs(300);

/// A worker that does not lead checks now and then that the leader
/// declares its periodic tasks as it does, and applies the maintenance
/// settings it was given. Only the leader enqueues ticks, so a task
/// declared on this worker alone (a scheduler worker beside a leader
/// without it, or a deploy that added it while a worker of the previous
/// build leads) would not run, without a word; and only the leader
/// recovers and cleans up, so this worker's recovery timeout or retentions
/// would be ignored, without a word (worker/leader_settings.rs).
#[derive(Default)]
struct FollowerCheck {
    next: Option<Instant>,
    /// When the leader's settings are next compared, and the leader they
    /// were last compared with (warned about once per leader).
    next_settings: Option<Instant>,
    compared_with: Option<String>,
}

impl FollowerCheck {
    async fn check(&mut self, shared: &Shared, own: &serde_json::Value) {
        self.check_settings(shared, own).await;
        self.check_periodic(shared).await;
    }

    async fn check_settings(&mut self, shared: &Shared, own: &serde_json::Value) {
        if self.next_settings.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let leader = call(&shared.engine, shared.deadline, "lease", async |conn| {
            db::lease_holder(conn, MAINTENANCE_LEASE).await
        })
        .await;
        match leader {
            // No leader now: next round.
            Ok(None) => {}
            // A leader of an older build, which records nothing: later.
            Ok(Some((_, None))) => {
                self.next_settings = Some(Instant::now() + FOLLOWER_CHECK_EVERY);
            }
            Ok(Some((holder, Some(theirs)))) => {
                self.next_settings = Some(Instant::now() + FOLLOWER_CHECK_EVERY);
                if self.compared_with.as_deref() == Some(holder.as_str()) {
                    return;
                }
                let differ = super::leader_settings::differences(own, &theirs);
                if !differ.is_empty() {
                    tracing::warn!(
                        leader = %holder,
                        differ = ?differ,
                        "this worker's maintenance settings differ from the leader's: only the \
                         leader recovers tasks, cleans up and forgets workers, so the leader's \
                         apply, and this worker's only while it leads; give every worker the \
                         same"
                    );
                }
                self.compared_with = Some(holder);
            }
            Err(error) => tracing::debug!(%error, "could not read the leader's settings"),
        }
    }

    async fn check_periodic(&mut self, shared: &Shared) {
        if shared.periodic.is_empty() || self.next.is_some_and(|t| Instant::now() < t) {
            return;
        }
        // A new leadership declares in its first round: give it two, and
        // five seconds at least (a round of a loaded machine with short
        // intervals can outlast two of them).
        let settle = (shared.config.maintenance_interval * 2).max(Duration::from_secs(5));
        let names = call(&shared.engine, shared.deadline, "periodic", async |conn| {
            crate::periodic::undeclared(conn, &shared.periodic, settle).await
        })
        .await;
        match names {
            // No leader yet, or a new one still declaring: next round.
            Ok(None) => {}
            Ok(Some(names)) => {
                self.next = Some(Instant::now() + FOLLOWER_CHECK_EVERY);
                if !names.is_empty() {
                    tracing::warn!(
                        periodic = ?names,
                        "periodic tasks declared on this worker are not declared so by the \
                         maintenance leader (none, or another schedule, type, queue or payload): \
                         only the leader enqueues ticks, so they run only while a worker \
                         declaring them leads; declare the same periodic tasks on every worker"
                    );
                }
            }
            // The rest of the round reports an outage; try next round.
            Err(error) => tracing::debug!(%error, "could not check the leader's periodic tasks"),
        }
    }
}

/// The time ticks are reckoned from, and how far the database's clock is
/// ahead of this machine's: the configured clock's time (a test's, offset
/// zero), or else the database's, the clock that judges the lease,
/// `execute_at` and the ticks taken back. (The worker's own clock, a few
/// seconds off, made a new leader take ticks its predecessor had enqueued
/// ahead for missed ones and drop them.)
async fn periodic_now(shared: &Shared) -> sqlx::Result<(DateTime<Utc>, TimeDelta)> {
    match shared.config.clock.now() {
        Some(now) => Ok((now, TimeDelta::zero())),
        None => {
            let offset = super::tick_wake::database_clock_offset(shared).await?;
            Ok((Utc::now() + offset, offset))
        }
    }
}

/// Records this worker's periodic declarations (once per leadership).
async fn declare_periodic(shared: &Shared) -> sqlx::Result<()> {
    let (now, _) = periodic_now(shared).await?;
    call(&shared.engine, shared.deadline, "periodic", async |conn| {
        crate::periodic::declare(conn, &shared.periodic, now).await
    })
    .await
}

/// Enqueues every periodic task's due tick not enqueued yet; returns the
/// database clock's offset it read, for the round's tick wake-ups.
async fn enqueue_periodic(shared: &Shared, holder: &str) -> sqlx::Result<TimeDelta> {
    if shared.periodic.is_empty() {
        return Ok(TimeDelta::zero());
    }
    let (now, offset) = periodic_now(shared).await?;
    let round = shared.config.maintenance_interval;
    let enqueued = call(&shared.engine, shared.deadline, "periodic", async |conn| {
        crate::periodic::enqueue_due(conn, &shared.periodic, now, holder, round).await
    })
    .await?;
    for (name, ticks) in enqueued {
        tracing::info!(periodic = %name, ticks, "enqueued periodic ticks");
    }
    Ok(offset)
}

/// One round of maintenance as the lease holder; recovery only when
/// `recover` (the database has been reachable long enough).
async fn maintain(
    shared: &Shared,
    holder: &str,
    recover: bool,
    last_cleanup: &mut Option<Instant>,
) -> sqlx::Result<()> {
    let config = &shared.config;
    // Both durations were checked when the worker was built.
    let timeout_us = delay_micros(config.heartbeat_timeout).unwrap_or(i64::MAX);
    let retention_us = delay_micros(config.retention).unwrap_or(i64::MAX);
    if recover {
        let report = call(&shared.engine, shared.deadline, "recovery", async |conn| {
            recover_stuck_as(conn, timeout_us, &config.clock, Some(holder)).await
        })
        .await?;
        if !report.recovered.is_empty() || !report.dead.is_empty() {
            tracing::warn!(
                recovered = ?report.recovered,
                dead = ?report.dead,
                "recovered tasks whose worker stopped heartbeating"
            );
        }
    }
    forget_gone_workers(shared).await?;
    // Best effort, like the key hand-over: a move that fails must not hold
    // recovery and cleanup back (the claims move the intake too).
    if let Err(error) = take_intake(shared).await {
        tracing::warn!(%error, "could not move the intake this round");
    }
    if last_cleanup.is_none_or(|t| t.elapsed() >= config.cleanup_interval) {
        // Best effort, like the key hand-over below: partition DDL gives up
        // on a lock it cannot get at once (a long reader of the history),
        // and that must not hold recovery back. Until a partition exists,
        // outcomes land in the default partition.
        if let Err(error) = history(shared).await {
            tracing::warn!(%error, "could not prepare or trim the task history this round");
        }
        if let Err(error) = event_log(shared).await {
            tracing::warn!(%error, "could not prepare or trim the event log this round");
        }
        // A large backlog is worked off over several rounds, half an
        // interval each, so the lease keeps being renewed on time.
        let budget = (config.maintenance_interval / 2).min(shared.deadline / 2);
        let (report, finished) = call(&shared.engine, shared.deadline, "cleanup", async |conn| {
            cleanup_completed_us(
                conn,
                retention_us,
                DEFAULT_BATCH,
                &config.clock,
                Some(budget),
            )
            .await
        })
        .await?;
        if report.deleted > 0 {
            tracing::info!(
                deleted = report.deleted,
                batches = report.batches,
                "cleaned up completed tasks"
            );
        }
        if finished {
            // The per-minute outcome counts are a small table; one statement.
            let now = config.clock.now();
            call(&shared.engine, shared.deadline, "cleanup", async |conn| {
                crate::db::throughput::delete_old(conn, now).await
            })
            .await?;
            // Once a cleanup interval (the look reads every task waiting
            // for a key): rare, and only once recovery may act.
            if recover && let Err(error) = release_orphan_holds(shared, holder, timeout_us).await {
                tracing::warn!(%error, "could not give back tasks held for runs that ended this round");
            }
            // Best effort: a key locked by an open submitting transaction
            // must not stop cleanup or hold recovery back; the next cleanup
            // tries again.
            if let Err(error) = tidy_keys(shared).await {
                tracing::warn!(%error, "could not hand on ordering keys this round");
            }
            if let Err(error) = tidy_events(shared, retention_us).await {
                tracing::warn!(%error, "could not trim the inbox this round");
            }
            if let Err(error) = tidy_workflows(shared, retention_us).await {
                tracing::warn!(%error, "could not delete finished workflows this round");
            }
            if let Err(error) = tidy_dead(shared).await {
                tracing::warn!(%error, "could not delete dead tasks past their retention this round");
            }
            *last_cleanup = Some(Instant::now());
        }
    }
    Ok(())
}

/// History partitions a maintenance round drops at most (each in a moment;
/// more wait for the next round, a minute later).
const DROPS_PER_ROUND: usize = 10;

/// Creates the history partitions ahead of time and drops those past the
/// retention.
async fn history(shared: &Shared) -> sqlx::Result<()> {
    let config = &shared.config;
    let width_us = delay_micros(config.history_partition).unwrap_or(i64::MAX);
    let retention_us = delay_micros(config.retention).unwrap_or(i64::MAX);
    let now = config.clock.now();
    let created = call(&shared.engine, shared.deadline, "history", async |conn| {
        crate::maintenance::prepare_history_us(conn, width_us, now).await
    })
    .await?;
    if created > 0 {
        tracing::info!(created, "created partitions of the task history");
    }
    let dropped = call(&shared.engine, shared.deadline, "history", async |conn| {
        db::history::drop_expired(conn, retention_us, DROPS_PER_ROUND, now).await
    })
    .await?;
    if !dropped.is_empty() {
        tracing::info!(partitions = ?dropped, "dropped history partitions past the retention");
    }
    Ok(())
}

/// Moves the tasks of the intake that no claim moved into `outbox_tasks`
/// (a backstop: every claim moves the intake first).
async fn take_intake(shared: &Shared) -> sqlx::Result<()> {
    let moved = call(&shared.engine, shared.deadline, "intake", async |conn| {
        crate::db::intake::take(conn, crate::db::intake::PER_ROUND).await
    })
    .await?;
    if let Some(moved_to) = moved {
        tracing::debug!(moved_to, "moved submitted tasks from the intake");
    }
    Ok(())
}

/// Removes the rows of workers gone for long (a small table: every round).
async fn forget_gone_workers(shared: &Shared) -> sqlx::Result<()> {
    let after_us = delay_micros(shared.config.forget_workers_after).unwrap_or(i64::MAX);
    let gone = call(&shared.engine, shared.deadline, "workers", async |conn| {
        crate::db::workers::prune(conn, after_us).await
    })
    .await?;
    if !gone.is_empty() {
        tracing::info!(workers = ?gone, "removed the rows of workers gone for long");
    }
    Ok(())
}

/// Gives back the tasks held in place for runs that nothing will run or
/// give back (release_orphan_holds.sql: left by a worker built before
/// migration 43, say), a batch at a time.
async fn release_orphan_holds(shared: &Shared, holder: &str, timeout_us: i64) -> sqlx::Result<()> {
    let mut released = Vec::new();
    loop {
        let now = shared.config.clock.now();
        let batch = call(&shared.engine, shared.deadline, "cleanup", async |conn| {
            crate::db::release_orphan_holds(conn, now, Some(holder), DEFAULT_BATCH, timeout_us)
                .await
        })
        .await?;
        let full = batch.len() as i64 == DEFAULT_BATCH;
        released.extend(batch);
        if !full {
            break;
        }
    }
    if !released.is_empty() {
        tracing::warn!(
            ?released,
            "gave back tasks held for runs whose running tasks had ended without them \
             (their worker is gone): they wait in their key's line again"
        );
    }
    Ok(())
}

/// Hands ordering keys that have a free place to their waiting tasks (the
/// rare hand-over a concurrent cancel made miss, or a raised per-key
/// concurrency), and deletes lock rows of keys long unused.
async fn tidy_keys(shared: &Shared) -> sqlx::Result<()> {
    let released = call(&shared.engine, shared.deadline, "cleanup", async |conn| {
        crate::db::queues::advance_keys(conn, None).await
    })
    .await?;
    if released > 0 {
        tracing::warn!(
            released,
            "handed ordering keys with a free place to their waiting tasks"
        );
    }
    call(&shared.engine, shared.deadline, "cleanup", async |conn| {
        crate::db::queues::prune_keys(conn, DEFAULT_BATCH).await
    })
    .await?;
    Ok(())
}

/// Deletes inbox records older than the retention (one batch per round:
/// the inbox grows at most as fast as events).
async fn tidy_events(shared: &Shared, retention_us: i64) -> sqlx::Result<()> {
    let deleted = call(&shared.engine, shared.deadline, "cleanup", async |conn| {
        crate::db::events::prune_inbox(conn, retention_us, DEFAULT_BATCH, shared.config.clock.now())
            .await
    })
    .await?;
    if deleted > 0 {
        tracing::info!(deleted, "trimmed the inbox");
    }
    Ok(())
}

/// How long a workflow must have been unchanged before maintenance looks
/// for steps whose task finished behind the triggers' back.
const SWEEP_QUIET: std::time::Duration = std::time::Duration::from_secs(60);

/// Workflows deleted at most per batch: each takes its steps and edges
/// along (a 10,000-step workflow is 20,000 rows).
const WORKFLOWS_PER_BATCH: i64 = 50;

/// Deletes dead tasks past `dead_retention`, if set (one batch per round:
/// the rest go in later rounds).
async fn tidy_dead(shared: &Shared) -> sqlx::Result<()> {
    // Checked when the worker was built.
    let Some(retention_us) = shared
        .config
        .dead_retention
        .map(|r| delay_micros(r).unwrap_or(i64::MAX))
    else {
        return Ok(());
    };
    let sql = include_str!("../db/sql/prune_dead_tasks.sql");
    let deleted = delete_expired(shared, sql, retention_us, DEFAULT_BATCH).await?;
    if deleted > 0 {
        tracing::info!(deleted, "deleted dead tasks past their retention");
    }
    Ok(())
}

/// One bounded retention batch of `sql` (see `db::delete_expired`) under
/// the engine's deadline: how many rows it deleted.
async fn delete_expired(
    shared: &Shared,
    sql: &'static str,
    retention_us: i64,
    batch: i64,
) -> sqlx::Result<u64> {
    call(&shared.engine, shared.deadline, "cleanup", async |conn| {
        crate::db::delete_expired(conn, sql, retention_us, batch, shared.config.clock.now()).await
    })
    .await
}

/// Deletes workflows that finished before the retention, as the history
/// drops their completed tasks; settles the steps of quiet workflows whose
/// task finished without the workflow being told (the safety net, as
/// tidy_keys is for ordering keys); and deletes the durable step records
/// of tasks that left outbox_tasks (one batch each per round).
async fn tidy_workflows(shared: &Shared, retention_us: i64) -> sqlx::Result<()> {
    let sql = include_str!("../db/sql/prune_workflows.sql");
    let deleted = delete_expired(shared, sql, retention_us, WORKFLOWS_PER_BATCH).await?;
    if deleted > 0 {
        tracing::info!(deleted, "deleted finished workflows past the retention");
    }
    let swept: i32 = call(&shared.engine, shared.deadline, "cleanup", async |conn| {
        sqlx::query_scalar(include_str!("../db/sql/sweep_workflows.sql"))
            .bind(delay_micros(SWEEP_QUIET).unwrap_or(i64::MAX))
            .bind(DEFAULT_BATCH)
            .fetch_one(&mut *conn)
            .await
    })
    .await?;
    if swept > 0 {
        tracing::warn!(
            swept,
            "settled workflow steps whose task finished without the workflow being told"
        );
    }
    let forgotten = call(&shared.engine, shared.deadline, "cleanup", async |conn| {
        crate::durable::prune(conn, DEFAULT_BATCH).await
    })
    .await?;
    if forgotten > 0 {
        tracing::debug!(
            forgotten,
            "deleted the durable steps and signals of finished tasks"
        );
    }
    Ok(())
}

/// Creates the event log's partitions ahead of time (a day each, three
/// days ahead) and drops those every subscription has passed, or that are
/// older than the log's maximum age whatever the subscriptions say.
async fn event_log(shared: &Shared) -> sqlx::Result<()> {
    const DAY_US: i64 = 24 * 3600 * 1_000_000;
    let config = &shared.config;
    let now = config.clock.now();
    let created = call(&shared.engine, shared.deadline, "event log", async |conn| {
        db::event_log::prepare(conn, 2 * DAY_US, DAY_US, now).await
    })
    .await?;
    if created > 0 {
        tracing::info!(created, "created partitions of the event log");
    }
    // An emitter's statement that started before a partition's end may
    // still be writing there: an hour's grace.
    let quiet_us = 3600 * 1_000_000;
    let max_age_us = delay_micros(config.event_log_max_age).unwrap_or(i64::MAX);
    let dropped = call(&shared.engine, shared.deadline, "event log", async |conn| {
        db::event_log::drop_passed(conn, quiet_us, max_age_us, DROPS_PER_ROUND, now).await
    })
    .await?;
    for (partition, forced) in dropped {
        if forced {
            metrics::counter!(crate::relay::metrics::FORCED_DROPS).increment(1);
            tracing::error!(
                %partition,
                "dropped an event log partition past the maximum age that a subscription had not \
                 passed: its unpublished events are lost to it (see `events subscriptions`)"
            );
        } else {
            tracing::info!(%partition, "dropped an event log partition every subscription had passed");
        }
    }
    // emit_once's guard lasts as long as the log keeps its events.
    let pruned = call(&shared.engine, shared.deadline, "event log", async |conn| {
        crate::db::events::prune_event_ids(conn, max_age_us, DEFAULT_BATCH, now).await
    })
    .await?;
    if pruned > 0 {
        tracing::info!(pruned, "trimmed the ids of events emitted once");
    }
    Ok(())
}
