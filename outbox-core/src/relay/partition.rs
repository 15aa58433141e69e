//! One leased partition of a subscription: read a batch, publish it, move
//! the cursor (with whatever the batch parked, in one transaction); try
//! parked aggregates again when they are due; renew the lease meanwhile.
//! Behind a backlog, the next batch is read while one is published.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lease_clock::LeaseClock;
use super::metrics as m;
use super::publish::{self, Aggregate, Halt, Interrupted, Running};
use crate::db::event_log::{self, Cursor, Holder, Lease, Settled};
use crate::db::session::{EnginePool, call};
use crate::worker::outage::Outage;

/// How often parked aggregates are looked at for one due again: sooner
/// when the first of them is due sooner, later when looks are dear (see
/// `Look::next`). An operator's retry or skip, made elsewhere, is seen
/// within this.
const PARKED_CHECK: Duration = Duration::from_secs(1);

/// How often the partition's parked aggregates are read whole (the sweep,
/// see `event_log::parked_aggregates`), besides when the partition is
/// taken: an aggregate an operator's skip emptied leaves the set, and a
/// time a race with an operator lost is put back. Sooner when a look
/// finds a time past but nothing due (a later event's time, left by a
/// relay of an earlier migration), but never more than a tenth of the
/// time.
const SWEEP: Duration = Duration::from_secs(60);

/// How far past its time the first parked event may be, by this clock,
/// when a look finds nothing due, before the list is swept at once.
const STALLED: Duration = Duration::from_secs(1);

/// How soon parked aggregates are looked at again when the first of them
/// was due already by this clock but not by the database's (whose clock
/// says when one is due).
const PAST_DUE_LOOK: Duration = Duration::from_millis(50);

/// An idle partition writes its cursor (moved past other partitions'
/// events) at most this often.
const IDLE_SAVE: Duration = Duration::from_secs(1);

/// How often a relay stopped by the position sequence (see
/// `event_log::head_problem`) looks again whether it was put right.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// What a partition's relay worker shares with its partitions.
pub(crate) struct Env {
    pub(crate) relay: Running,
    pub(crate) engine: EnginePool,
    pub(crate) deadline: Duration,
    pub(crate) subscription: String,
    pub(crate) stream: String,
    pub(crate) partitions: i32,
    pub(crate) holder: String,
    pub(crate) batch: i64,
    pub(crate) poll: Duration,
    pub(crate) lease_ttl: Duration,
}

impl Env {
    pub(crate) fn ttl_us(&self) -> i64 {
        self.lease_ttl.as_micros() as i64
    }
}

/// How a partition's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Asked to stop (shutdown, or handed to another worker): the lease
    /// goes back.
    Stopped,
    /// The lease was lost or ran out: someone else may hold it.
    Lost,
}

/// Runs partition `lease`, whose request was sent at `sent`, until `stop`
/// (no new batch; the current one finishes unless `abandon` fires or the
/// relay's circuit is open) or the lease is lost. Releases the lease when
/// stopped.
pub(crate) async fn run(
    env: Arc<Env>,
    lease: Lease,
    sent: Instant,
    stop: CancellationToken,
    abandon: CancellationToken,
) -> End {
    // From the request's sending, not from this task's start: a task that
    // starts late must not think its lease younger than it is.
    let clock = LeaseClock::new(env.lease_ttl, sent);
    let part = Partition {
        env: &env,
        part: lease.part,
        fence: lease.fence,
        clock: &clock,
    };
    tracing::info!(relay = %env.relay.name, part = lease.part, fence = lease.fence, "partition leased");
    let end = part.work(lease.cursor, &stop, &abandon).await;
    if end == End::Stopped {
        let held = [(lease.part, lease.fence)];
        let released = call(&env.engine, env.deadline, "relay lease", async |conn| {
            event_log::release(conn, &env.subscription, &env.holder, &held).await
        })
        .await;
        if let Err(error) = released {
            tracing::info!(relay = %env.relay.name, part = lease.part, %error, "could not hand the partition back; its lease runs out by itself");
        }
    } else {
        tracing::warn!(relay = %env.relay.name, part = lease.part, "partition lease lost (an operator's rewind takes leases back, a database out of reach lets them run out, or another relay worker took it); the worker asks for partitions again");
    }
    end
}

struct Partition<'a> {
    env: &'a Env,
    part: i32,
    fence: i64,
    clock: &'a LeaseClock,
}

impl Partition<'_> {
    fn holder(&self) -> Holder<'_> {
        Holder {
            subscription: &self.env.subscription,
            part: self.part,
            holder: &self.env.holder,
            fence: self.fence,
        }
    }

    async fn work(
        &self,
        mut cursor: Cursor,
        stop: &CancellationToken,
        abandon: &CancellationToken,
    ) -> End {
        let env = self.env;
        let mut outage = Outage::new("relay");
        let mut saved = cursor.clone();
        let mut saved_at = std::time::Instant::now();
        // Read whole at the first look (the sweep); kept up to date between.
        let mut parked: Option<Parked> = None;
        // When to look at the parked aggregates again.
        let mut parked_next: Option<std::time::Instant> = None;
        let mut settled = Settled::default();
        // Why the last read was refused (event_log::head_problem), if it was.
        let mut stopped: Option<String> = None;
        // The read after the batch being published, made meanwhile (from
        // where that batch ends), so that the broker is not left idle
        // while the next batch is read: a read depends on nothing a
        // publish or a cursor write changes.
        let mut ahead: Option<sqlx::Result<event_log::Batch>> = None;
        loop {
            if stop.is_cancelled() {
                return End::Stopped;
            }
            if !self.clock.held() {
                return End::Lost;
            }
            if self.clock.due() {
                match self.renew().await {
                    Ok(true) => {}
                    Ok(false) => return End::Lost,
                    Err(error) => {
                        let wait = outage.failed(&error);
                        if self.pause(wait, stop).await {
                            return End::Stopped;
                        }
                        continue;
                    }
                }
            }
            let now = std::time::Instant::now();
            if parked.as_ref().is_none_or(|p| now >= p.sweep_at) {
                match self.sweep().await {
                    Ok(swept) => parked = Some(swept),
                    Err(error) => {
                        let wait = outage.failed(&error);
                        if self.pause(wait, stop).await {
                            return End::Stopped;
                        }
                        continue;
                    }
                }
            }
            let Some(held) = parked.as_mut() else {
                continue;
            };
            if parked_next.is_none_or(|t| now >= t) {
                match self
                    .replay_parked(&mut held.aggregates, Halt { stop, abandon })
                    .await
                {
                    Ok(Some(look)) => {
                        parked_next = Some(look.next());
                        if look.stalled() {
                            held.sweep_at = held.sweep_at.min(held.sweep_floor);
                        }
                    }
                    Ok(None) => return End::Lost,
                    Err(Failure::Db(error)) => {
                        let wait = outage.failed(&error);
                        if self.pause(wait, stop).await {
                            return End::Stopped;
                        }
                        continue;
                    }
                    Err(Failure::Interrupted(Interrupted::Abandoned)) => return End::Stopped,
                    Err(Failure::Interrupted(Interrupted::LeaseExpired)) => return End::Lost,
                }
            }
            let read = match ahead.take() {
                Some(read) => read,
                None => self.read(&cursor, &settled).await,
            };
            let batch = match read {
                Ok(batch) => {
                    outage.ok();
                    if stopped.take().is_some() {
                        tracing::info!(
                            relay = %env.relay.name,
                            part = self.part,
                            "relay reading again: the event log's position sequence is as it must be"
                        );
                    }
                    if let Some(mark) = batch.mark {
                        settled.observe(mark);
                    }
                    batch
                }
                Err(sqlx::Error::Configuration(problem)) => {
                    // Not an outage: the database answered, and the relay
                    // waits for an operator. Said once, not at every look.
                    let problem = problem.to_string();
                    if stopped.as_deref() != Some(&problem) {
                        tracing::error!(relay = %env.relay.name, part = self.part, "relay stopped: {problem}");
                    }
                    stopped = Some(problem);
                    if self.pause(LOOK_AGAIN, stop).await {
                        return End::Stopped;
                    }
                    continue;
                }
                Err(error) => {
                    let wait = outage.failed(&error);
                    if self.pause(wait, stop).await {
                        return End::Stopped;
                    }
                    continue;
                }
            };
            if batch.events.is_empty() {
                // A cut a whole batch past the cursor may have more behind it.
                let capped = batch.next.position - cursor.position >= env.batch;
                cursor = batch.next;
                if cursor != saved && saved_at.elapsed() >= IDLE_SAVE {
                    match self.commit(&cursor, 0, &[]).await {
                        Ok(true) => {
                            saved = cursor.clone();
                            saved_at = std::time::Instant::now();
                        }
                        Ok(false) => return End::Lost,
                        Err(error) => {
                            outage.failed(&error);
                        }
                    }
                }
                if !capped && self.pause(env.poll, stop).await {
                    return End::Stopped;
                }
                continue;
            }
            let set = &mut held.aggregates;
            let count = batch.events.len();
            // A batch cut at its limit has more behind it: read that
            // meanwhile. (After a shorter one, a read then would most
            // likely find nothing yet, and the relay would wait its poll
            // before reading again.)
            let full =
                batch.next.position - cursor.position >= env.batch || count as i64 >= env.batch;
            let published = self
                .publish(
                    batch.events,
                    &batch.next,
                    set,
                    full.then_some(&settled),
                    &mut outage,
                    Halt { stop, abandon },
                )
                .await;
            let (done, read) = match published {
                Ok(both) => both,
                Err(end) => return end,
            };
            ahead = read;
            outage.ok();
            set.extend(done.newly_parked);
            if !done.parked.is_empty() {
                m::parked(&env.relay.name, done.parked.len());
            }
            tracing::trace!(relay = %env.relay.name, part = self.part, count, "batch published");
            cursor = batch.next;
            saved = cursor.clone();
            saved_at = std::time::Instant::now();
        }
    }

    /// Waits `d`; true when asked to stop meanwhile.
    async fn pause(&self, d: Duration, stop: &CancellationToken) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => false,
            () = stop.cancelled() => true,
        }
    }

    /// Publishes a batch's `events` and writes the cursor after it
    /// (`next`), reading the batch after it meanwhile when given what is
    /// `settled` (`read_ahead`); returns what became of the batch and that
    /// read, or how the partition's run ends.
    async fn publish(
        &self,
        events: Vec<event_log::LogEvent>,
        next: &Cursor,
        parked: &HashSet<Aggregate>,
        read_ahead: Option<&Settled>,
        outage: &mut Outage,
        halt: Halt<'_>,
    ) -> Result<(publish::Done, Option<sqlx::Result<event_log::Batch>>), End> {
        let abandon = halt.abandon;
        let env = self.env;
        let reading = async {
            match read_ahead {
                Some(settled) => Some(self.read(next, settled).await),
                None => None,
            }
        };
        tokio::pin!(reading);
        let mut ahead = None;
        let done = {
            // Dropped at the end of this block: a renewal cut short here
            // must not hold its session (behind a pooler, its transaction
            // and the cursor row's lock) while the cursor is written.
            let publishing = publish::batch(&env.relay, events, parked, self.clock, halt);
            let keeping = self.keep_lease();
            tokio::pin!(publishing, keeping);
            loop {
                tokio::select! {
                    r = &mut publishing => break r,
                    r = &mut reading, if ahead.is_none() => ahead = Some(r),
                    lost = &mut keeping => {
                        tracing::warn!(relay = %env.relay.name, part = self.part, ?lost, "lease lost while publishing");
                        return Err(End::Lost);
                    }
                }
            }
        };
        let done = match done {
            Ok(done) => done,
            Err(Interrupted::Abandoned) => return Err(End::Stopped),
            Err(Interrupted::LeaseExpired) => return Err(End::Lost),
        };
        // The broker has the batch: the cursor must move, or it is all
        // published again. Retried through outages for as long as the
        // lease surely holds. The read ahead, if still out, finishes
        // meanwhile (within its deadline).
        let saving =
            self.write_while_held(outage, || self.commit(next, done.published, &done.parked));
        // A shutdown past its grace does not wait for a read it would
        // throw away.
        let rest_of_read = async {
            tokio::select! {
                read = &mut reading => read,
                () = abandon.cancelled() => None,
            }
        };
        let (saved, read) = match ahead {
            Some(read) => (saving.await, read),
            None => tokio::join!(saving, rest_of_read),
        };
        if saved {
            Ok((done, read))
        } else {
            Err(End::Lost)
        }
    }

    /// Runs `write`, a fenced write of what the broker took (true when the
    /// lease still held), again through outages for as long as the lease
    /// surely holds: unwritten, it is all published again. False when the
    /// lease was lost or ran out.
    async fn write_while_held<F>(&self, outage: &mut Outage, mut write: impl FnMut() -> F) -> bool
    where
        F: Future<Output = sqlx::Result<bool>>,
    {
        loop {
            match write().await {
                Ok(held) => return held,
                Err(error) => {
                    let wait = outage.failed(&error);
                    if !self.clock.held() {
                        return false;
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// The next batch after `cursor`.
    async fn read(&self, cursor: &Cursor, settled: &Settled) -> sqlx::Result<event_log::Batch> {
        let env = self.env;
        call(&env.engine, env.deadline, "relay read", async |conn| {
            event_log::read(
                conn,
                cursor,
                env.batch,
                settled,
                &env.stream,
                env.partitions,
                self.part,
            )
            .await
        })
        .await
    }

    /// Renews the lease; false when it was lost.
    async fn renew(&self) -> sqlx::Result<bool> {
        let env = self.env;
        let sent = Instant::now();
        let held = [(self.part, self.fence)];
        let kept = call(&env.engine, env.deadline, "relay lease", async |conn| {
            event_log::renew(conn, &env.subscription, &env.holder, &held, env.ttl_us()).await
        })
        .await?;
        if kept.contains(&self.part) {
            self.clock.renewed(sent);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Renews the lease while a batch is published; returns once it is
    /// lost (never while it holds).
    async fn keep_lease(&self) -> &'static str {
        loop {
            tokio::time::sleep(self.env.lease_ttl / 10).await;
            if let Some(lost) = self.renew_when_due().await {
                return lost;
            }
        }
    }

    /// Renews the lease if it is time to; says how it was lost, if it was.
    async fn renew_when_due(&self) -> Option<&'static str> {
        if !self.clock.due() {
            return None;
        }
        match self.renew().await {
            Ok(true) => None,
            Ok(false) => Some("taken"),
            // A publish checks the clock before each event; here a failed
            // renewal only means trying again.
            Err(_) if self.clock.held() => None,
            Err(_) => Some("ran out"),
        }
    }

    /// Writes the cursor and what the batch parked, in one transaction,
    /// fenced; false when the lease was lost.
    async fn commit(
        &self,
        next: &Cursor,
        published: i64,
        parked: &[event_log::Parking],
    ) -> sqlx::Result<bool> {
        let env = self.env;
        let sent = Instant::now();
        let held = call(&env.engine, env.deadline, "relay cursor", async |conn| {
            let mut tx = conn.begin().await?;
            event_log::park(&mut tx, self.holder(), parked).await?;
            let held =
                event_log::advance(&mut tx, self.holder(), next, published, env.ttl_us()).await?;
            if held {
                tx.commit().await?;
            }
            Ok(held)
        })
        .await?;
        if held {
            self.clock.renewed(sent);
        }
        Ok(held)
    }

    /// Reads the partition's parked aggregates whole (and puts right what
    /// a race with an operator may have left, see
    /// `event_log::parked_aggregates`).
    async fn sweep(&self) -> sqlx::Result<Parked> {
        let env = self.env;
        let reading = std::time::Instant::now();
        let rows = call(&env.engine, env.deadline, "relay parked", async |conn| {
            event_log::parked_aggregates(conn, &env.subscription, env.partitions, self.part).await
        })
        .await?;
        let now = std::time::Instant::now();
        let floor = reading.elapsed() * 10;
        Ok(Parked {
            aggregates: rows.into_iter().collect(),
            sweep_at: now + SWEEP.max(floor),
            sweep_floor: now + floor,
        })
    }

    /// Publishes the parked events that are due again, in order, takes
    /// the aggregates it emptied out of `aggregates`, and says when to look
    /// again; none when the lease was lost.
    async fn replay_parked(
        &self,
        aggregates: &mut HashSet<Aggregate>,
        halt: Halt<'_>,
    ) -> Result<Option<Look>, Failure> {
        let env = self.env;
        let looking = std::time::Instant::now();
        let look = call(&env.engine, env.deadline, "relay parked", async |conn| {
            event_log::parked_due(
                conn,
                &env.subscription,
                env.partitions,
                self.part,
                env.batch,
            )
            .await
        })
        .await?;
        let read_due = looking.elapsed();
        let event_log::ParkedDue {
            events: due,
            held: found,
            mut seen,
        } = look;
        // A whole batch due: more may be, to try at once.
        let full = due.len() as i64 >= env.batch;
        // Due rows come in position order, aggregates interleaved. The
        // aggregates are published at once, as a batch's are, and what
        // became of them is written in one statement. (One at a time,
        // delayed events coming due together took a broker's and a
        // database's round trip each, with the log waiting behind them:
        // 1,600 events/s where a batch went at 57,000.)
        let (keys, groups): (Vec<_>, Vec<_>) = publish::by_aggregate(due).into_iter().unzip();
        if groups.is_empty() {
            return self.soonest(false, true, read_due).await.map(Some);
        }
        let positions: Vec<Vec<i64>> = groups
            .iter()
            .map(|group| group.iter().map(|e| e.position).collect())
            .collect();
        // The lease is renewed meanwhile, as while a batch is published:
        // an aggregate's events, refused again and again a second apart
        // or many of them, can take longer than the lease, and a retry cut
        // short by its run-out would start over at the next lease, again
        // and again, with the partition's log behind it. Dropped at the
        // end of this block, before the unpark (see `publish`).
        let results = {
            let publishing = publish::aggregates(&env.relay, groups, self.clock, halt);
            let keeping = self.keep_lease();
            tokio::pin!(publishing, keeping);
            tokio::select! {
                r = &mut publishing => r?,
                lost = &mut keeping => {
                    tracing::warn!(relay = %env.relay.name, part = self.part, ?lost, "lease lost while publishing held-back events");
                    return Ok(None);
                }
            }
        };
        let mut outcome = event_log::Unparked::default();
        let mut emptied = Vec::new();
        for ((key, positions), (published, rest)) in keys.into_iter().zip(&positions).zip(results) {
            outcome
                .published
                .extend_from_slice(&positions[..published as usize]);
            // All published: when the look read every event the
            // aggregate held back, it holds back none now; otherwise the
            // first of those left needs its time, and the next look comes
            // at once.
            if rest.is_empty() {
                if found.get(&key) == Some(&(positions.len() as i64)) {
                    emptied.push(key);
                } else {
                    outcome.cut.push(key);
                }
            }
            if let Some(first) = rest.first() {
                outcome.again.push(first.event.position);
                outcome.retry_at.push(first.retry_at);
                outcome.error.push(first.error.clone());
                let version = seen.remove(&first.event.position);
                // The look read it: without its version, an operator's retry
                // made meanwhile would be undone.
                debug_assert!(version.is_some(), "position {}", first.event.position);
                outcome.seen.push(version);
            }
        }
        // The broker has them: as with a batch's cursor, retried through
        // outages for as long as the lease surely holds, or they are all
        // published again.
        let mut outage = Outage::new("relay");
        let held = self
            .write_while_held(&mut outage, || {
                call(&env.engine, env.deadline, "relay parked", async |conn| {
                    event_log::unpark(conn, self.holder(), &outcome).await
                })
            })
            .await;
        if !held {
            return Ok(None);
        }
        for key in &emptied {
            aggregates.remove(key);
        }
        let published = !outcome.published.is_empty();
        if published {
            tracing::info!(relay = %env.relay.name, published = outcome.published.len(), "published held-back events");
        }
        // Only when some went out: a whole batch tried and held back again
        // (due by the database's clock, not yet by this one's) waits.
        let more = published && (full || !outcome.cut.is_empty());
        self.soonest(more, false, read_due).await.map(Some)
    }

    /// When to look at the parked aggregates again; `more` when more may
    /// be due already, `found_none` when the look found nothing due.
    /// `read_due` is what reading the due ones took.
    async fn soonest(
        &self,
        more: bool,
        found_none: bool,
        read_due: Duration,
    ) -> Result<Look, Failure> {
        let env = self.env;
        let reading = std::time::Instant::now();
        let (soonest, db_now) = call(&env.engine, env.deadline, "relay parked", async |conn| {
            event_log::parked_soonest(conn, &env.subscription, env.partitions, self.part).await
        })
        .await?;
        Ok(Look {
            soonest,
            more,
            found_none,
            db_now,
            cost: read_due + reading.elapsed(),
        })
    }
}

/// A partition's parked aggregates: those whose new events join them.
struct Parked {
    aggregates: HashSet<Aggregate>,
    /// When to read them whole again.
    sweep_at: std::time::Instant,
    /// The soonest that may be: ten times what the last sweep cost after
    /// it.
    sweep_floor: std::time::Instant,
}

/// What a look at the parked aggregates found.
struct Look {
    /// When the first of them is due to be tried again (by the database's
    /// clock), if any is.
    soonest: Option<chrono::DateTime<chrono::Utc>>,
    /// More may be due already.
    more: bool,
    /// The look found nothing due.
    found_none: bool,
    /// The database's time when it read `soonest`.
    db_now: chrono::DateTime<chrono::Utc>,
    /// What the look's two reads took.
    cost: Duration,
}

impl Look {
    /// Whether the look found nothing due though the first time is well
    /// past by the database's clock: what the due index found was not
    /// first (see `STALLED`).
    fn stalled(&self) -> bool {
        self.found_none
            && self
                .soonest
                .is_some_and(|at| (self.db_now - at).to_std().is_ok_and(|d| d > STALLED))
    }

    /// When to look again: at once when more may be due, when the first
    /// is due (so that a delayed event goes out at its time, not up to a
    /// second later), and `PARKED_CHECK` from now at the latest. But no
    /// sooner than ten times what this look cost, even past
    /// `PARKED_CHECK`: a look reads the due aggregates through an index,
    /// but with many due at once in other partitions, or a database under
    /// load, looks following each other would take the time the log
    /// needs. Looks take a tenth of the time at most.
    fn next(&self) -> std::time::Instant {
        let now = std::time::Instant::now();
        if self.more {
            return now;
        }
        let until = self.soonest.map_or(PARKED_CHECK, |at| {
            (at - chrono::Utc::now()).to_std().unwrap_or(PAST_DUE_LOOK)
        });
        let floor = self.cost * 10;
        now + until.min(PARKED_CHECK).max(floor)
    }
}

/// Why trying parked events stopped.
enum Failure {
    Db(sqlx::Error),
    Interrupted(Interrupted),
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        Self::Db(e)
    }
}

impl From<Interrupted> for Failure {
    fn from(e: Interrupted) -> Self {
        Self::Interrupted(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(soonest_ms: Option<i64>, more: bool, cost_ms: u64) -> Duration {
        let look = Look {
            soonest: soonest_ms.map(|ms| chrono::Utc::now() + chrono::Duration::milliseconds(ms)),
            more,
            found_none: false,
            db_now: chrono::Utc::now(),
            cost: Duration::from_millis(cost_ms),
        };
        look.next()
            .saturating_duration_since(std::time::Instant::now())
    }

    #[test]
    fn a_look_that_finds_nothing_due_while_the_first_time_is_well_past_is_stalled() {
        let db_now = chrono::Utc::now();
        let look = |found_none: bool, past_ms: i64| Look {
            soonest: Some(db_now - chrono::Duration::milliseconds(past_ms)),
            more: false,
            found_none,
            db_now,
            cost: Duration::from_millis(1),
        };
        assert!(look(true, 5000).stalled());
        // Just due: the look may have read before it was.
        assert!(!look(true, 500).stalled());
        // Found some: a look came after them.
        assert!(!look(false, 5000).stalled());
        // Nothing with a time.
        let none = Look {
            soonest: None,
            ..look(true, 0)
        };
        assert!(!none.stalled());
    }

    #[test]
    fn parked_events_are_looked_at_when_due_but_never_at_more_than_a_tenth_of_the_time() {
        // Nothing due: a second.
        assert!(look(None, false, 1) > Duration::from_millis(900));
        // Due in 300 ms: then (the clocks read between may move a little).
        let due = look(Some(300), false, 1);
        assert!(
            due > Duration::from_millis(200) && due <= Duration::from_millis(300),
            "{due:?}"
        );
        // Due already by this clock, not by the database's: soon.
        assert!(look(Some(-500), false, 1) <= PAST_DUE_LOOK);
        // A look that cost 50 ms: not again within 500 ms, due or not.
        let dear = look(Some(10), false, 50);
        assert!(dear > Duration::from_millis(400), "{dear:?}");
        // Dearer still: ten times the cost, past the usual second.
        assert!(look(Some(10), false, 500) > Duration::from_millis(4500));
        // A whole batch was due and went out: at once.
        assert_eq!(look(Some(300), true, 50), Duration::ZERO);
    }
}
