//! Statements about the event log: subscriptions, their partitions'
//! leases and cursors, batches, held-back (parked) events, retention.

use std::collections::{HashMap, VecDeque};

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// One event as a relay reads it from the log or the parked list.
#[derive(Debug, Clone)]
pub(crate) struct LogEvent {
    pub(crate) position: i64,
    pub(crate) id: String,
    pub(crate) aggregatetype: String,
    pub(crate) aggregateid: String,
    pub(crate) event_type: String,
    /// The payload's JSON as PostgreSQL writes jsonb out: passed on as it
    /// is (but for the spaces between tokens), not parsed and written
    /// again, which cost the relay more than anything else it does per
    /// event and rounded numbers beyond 64 bits.
    pub(crate) payload: Option<String>,
    pub(crate) headers: Option<serde_json::Value>,
    pub(crate) publish_at: Option<DateTime<Utc>>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) aggregate_hash: i32,
}

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for LogEvent {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> sqlx::Result<Self> {
        EventColumns::of(row)?.event(row)
    }
}

/// Where an event's fields are among a result's columns. A column looked
/// up by name is a hash of the name at every row; a relay reads tens of
/// thousands of rows a second, so its reads find the places once per
/// result and take each row's fields by place.
#[derive(Debug, Clone, Copy)]
struct EventColumns {
    position: usize,
    id: usize,
    aggregatetype: usize,
    aggregateid: usize,
    event_type: usize,
    payload: usize,
    headers: usize,
    publish_at: usize,
    created_at: usize,
    aggregate_hash: usize,
}

impl EventColumns {
    /// The places of the event's columns in `row`'s result.
    fn of(row: &sqlx::postgres::PgRow) -> sqlx::Result<Self> {
        use sqlx::Row;
        let at = |name: &str| row.try_column(name).map(sqlx::Column::ordinal);
        Ok(Self {
            position: at("position")?,
            id: at("id")?,
            aggregatetype: at("aggregatetype")?,
            aggregateid: at("aggregateid")?,
            event_type: at("type")?,
            payload: at("payload")?,
            headers: at("headers")?,
            publish_at: at("publish_at")?,
            created_at: at("created_at")?,
            aggregate_hash: at("aggregate_hash")?,
        })
    }

    /// The event of `row`, a row of the result these places were found in.
    fn event(&self, row: &sqlx::postgres::PgRow) -> sqlx::Result<LogEvent> {
        Ok(LogEvent {
            position: field(row, self.position, "position")?,
            id: field(row, self.id, "id")?,
            aggregatetype: field(row, self.aggregatetype, "aggregatetype")?,
            aggregateid: field(row, self.aggregateid, "aggregateid")?,
            event_type: field(row, self.event_type, "type")?,
            payload: field(row, self.payload, "payload")?,
            headers: field(row, self.headers, "headers")?,
            publish_at: field(row, self.publish_at, "publish_at")?,
            created_at: field(row, self.created_at, "created_at")?,
            aggregate_hash: field(row, self.aggregate_hash, "aggregate_hash")?,
        })
    }
}

/// Column `at` of `row`; an error names it `name`, as a lookup by name
/// would have.
fn field<'r, T>(row: &'r sqlx::postgres::PgRow, at: usize, name: &str) -> sqlx::Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    use sqlx::Row;
    row.try_get(at).map_err(|e| match e {
        sqlx::Error::ColumnDecode { source, .. } => sqlx::Error::ColumnDecode {
            index: format!("{name:?}"),
            source,
        },
        other => other,
    })
}

/// A cursor: published is exactly what is at or below `position` but for
/// the `gaps`, positions not visible when it passed them. Each gap's bound
/// (same index in `gap_bounds`) is a transaction id above its emitter's:
/// once every transaction below it has ended, a gap still not visible was
/// rolled back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Cursor {
    pub(crate) position: i64,
    pub(crate) gaps: Vec<i64>,
    pub(crate) gap_bounds: Vec<i64>,
}

impl Cursor {
    /// The cursor after a read that cut at `end` under a snapshot with
    /// `xmin`, when the next transaction id was `next_xid`, in which
    /// `visible` (sorted) were the positions visible in (position, end] or
    /// at a gap. Positions at or below `settled` (see [`Settled`]) that
    /// are not visible never will be: no gap is kept for them.
    fn after(&self, end: i64, xmin: i64, next_xid: i64, visible: &[i64], settled: i64) -> Cursor {
        let seen = |p: i64| visible.binary_search(&p).is_ok();
        let mut next = Cursor {
            position: end,
            ..Cursor::default()
        };
        for (&p, &bound) in self.gaps.iter().zip(&self.gap_bounds) {
            // Filled now, or its emitter has ended without committing.
            if !seen(p) && xmin < bound && p > settled {
                next.gaps.push(p);
                next.gap_bounds.push(bound);
            }
        }
        for p in self.position.max(settled) + 1..=end {
            if !seen(p) {
                next.gaps.push(p);
                next.gap_bounds.push(next_xid);
            }
        }
        next
    }
}

/// How far a relay's partition knows the log to be settled: every
/// position at or below [`Settled::position`] is either visible to every
/// snapshot from now on or never will be, so a read may pass any number of
/// them without keeping a gap for each.
///
/// Each read leaves a mark: the sequence's last value (read first) and the
/// next transaction id (read after the snapshot was taken). Every position
/// up to that value was drawn by a transaction below that id (it had its
/// id before it drew), and every transaction from that id on draws above
/// it (it gets its id after the value was read). So once a later
/// snapshot's xmin reaches the id, every transaction that could still
/// write at or below the value has ended. A relay catching up over a long
/// stretch of positions that hold no event (a new subscription from the
/// start of a log whose early events retention dropped, or drawn by
/// rolled-back emits) then reads it by the events there are, a batch of
/// them at a time, instead of a batch of positions at a time with a gap
/// for each.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    position: i64,
    /// The highest last value seen: the sequence never goes below it.
    seen: i64,
    /// (last value, next transaction id) of recent reads, oldest first.
    marks: VecDeque<(i64, i64)>,
}

impl Settled {
    /// Marks kept at most: a later mark is as true as the one it replaces
    /// and only settles later, so dropping marks is safe.
    const MARKS: usize = 64;

    /// Every position at or below this one is settled.
    pub(crate) fn position(&self) -> i64 {
        self.position
    }

    /// Takes in a read: its mark, and its snapshot's xmin, which settles
    /// every mark at or below it.
    pub(crate) fn observe(&mut self, mark: Mark) {
        self.seen = self.seen.max(mark.last);
        self.marks.push_back((mark.last, mark.next_xid));
        if self.marks.len() > Self::MARKS {
            // Keep the oldest marks, which settle first; the newest one
            // stands for the ones it replaces.
            let newest = self.marks.pop_back();
            self.marks.pop_back();
            self.marks.extend(newest);
        }
        while let Some(&(last, next_xid)) = self.marks.front() {
            if next_xid > mark.xmin {
                break;
            }
            self.position = self.position.max(last);
            self.marks.pop_front();
        }
    }
}

/// What a read saw of the log as a whole, for [`Settled`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    last: i64,
    next_xid: i64,
    xmin: i64,
}

/// A leased partition.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub(crate) part: i32,
    pub(crate) fence: i64,
    pub(crate) cursor: Cursor,
}

/// Who holds which partition of a subscription, for fenced writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holder<'a> {
    pub(crate) subscription: &'a str,
    pub(crate) part: i32,
    pub(crate) holder: &'a str,
    pub(crate) fence: i64,
}

/// A new subscription as created: its stream and partitions as recorded,
/// where its cursors start when this call created it, and its kind of
/// sink as recorded.
pub(crate) type Subscribed = (String, i32, Option<i64>, Option<String>);

/// Creates the subscription unless it exists, its cursors where `start`
/// says; returns it as recorded, or none when a concurrent creator got
/// there first (ask again).
pub(crate) async fn subscribe(
    conn: &mut PgConnection,
    name: &str,
    stream: &str,
    partitions: i32,
    start: crate::relay::Start,
    sink: &str,
) -> sqlx::Result<Option<Subscribed>> {
    let (mode, position, time) = start_params(start);
    sqlx::query_as(include_str!("sql/event_subscribe.sql"))
        .bind(name)
        .bind(stream)
        .bind(partitions)
        .bind(mode)
        .bind(position)
        .bind(time)
        .bind(sink)
        .fetch_optional(conn)
        .await
}

/// A [`crate::relay::Start`] as the parameters of event_subscribe.sql and
/// event_rewind.sql: its kind, and its position or time.
pub(crate) fn start_params(
    start: crate::relay::Start,
) -> (&'static str, Option<i64>, Option<DateTime<Utc>>) {
    use crate::relay::Start;
    match start {
        Start::Beginning => ("start", None, None),
        Start::Head => ("head", None, None),
        Start::Position(p) => ("position", Some(p), None),
        Start::Time(t) => ("time", None, Some(t)),
    }
}

/// Moves subscription `name`'s cursors to `to` (event_rewind.sql);
/// returns the position it now publishes after, or none when there is no
/// such subscription.
pub(crate) async fn rewind(
    conn: &mut PgConnection,
    name: &str,
    to: crate::relay::Start,
) -> sqlx::Result<Option<i64>> {
    let (mode, position, time) = start_params(to);
    sqlx::query_scalar(include_str!("sql/event_rewind.sql"))
        .bind(name)
        .bind(mode)
        .bind(position)
        .bind(time)
        .fetch_optional(conn)
        .await
}

/// Says `member` has stopped.
pub(crate) async fn leave(
    conn: &mut PgConnection,
    subscription: &str,
    member: &str,
) -> sqlx::Result<()> {
    sqlx::query(include_str!("sql/event_leave.sql"))
        .bind(subscription)
        .bind(member)
        .execute(conn)
        .await
        .map(drop)
}

/// Says `member` is alive for `ttl_us`, and how long its publishes have
/// failed and why (`failing`, none while they succeed); returns how many
/// members are alive.
pub(crate) async fn member(
    conn: &mut PgConnection,
    subscription: &str,
    member: &str,
    ttl_us: i64,
    failing: Option<(std::time::Duration, String)>,
) -> sqlx::Result<i64> {
    let (failing_us, why) = match failing {
        Some((d, why)) => (
            Some(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
            Some(why),
        ),
        None => (None, None),
    };
    sqlx::query_scalar(include_str!("sql/event_member.sql"))
        .bind(subscription)
        .bind(member)
        .bind(ttl_us)
        .bind(failing_us)
        .bind(why)
        .fetch_one(conn)
        .await
}

/// Leases up to `want` free partitions.
pub(crate) async fn acquire(
    conn: &mut PgConnection,
    subscription: &str,
    holder: &str,
    ttl_us: i64,
    want: i64,
) -> sqlx::Result<Vec<Lease>> {
    /// part, fence, position, gaps, gap bounds.
    type Row = (i32, i64, i64, Vec<i64>, Vec<i64>);
    let rows: Vec<Row> = sqlx::query_as(include_str!("sql/event_acquire.sql"))
        .bind(subscription)
        .bind(holder)
        .bind(ttl_us)
        .bind(want)
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(part, fence, position, gaps, gap_bounds)| Lease {
            part,
            fence,
            cursor: Cursor {
                position,
                gaps,
                gap_bounds,
            },
        })
        .collect())
}

/// Renews the leases of `held` (part, fence); returns the parts still held.
pub(crate) async fn renew(
    conn: &mut PgConnection,
    subscription: &str,
    holder: &str,
    held: &[(i32, i64)],
    ttl_us: i64,
) -> sqlx::Result<Vec<i32>> {
    let (parts, fences): (Vec<i32>, Vec<i64>) = held.iter().copied().unzip();
    sqlx::query_scalar(include_str!("sql/event_renew.sql"))
        .bind(subscription)
        .bind(holder)
        .bind(parts)
        .bind(fences)
        .bind(ttl_us)
        .fetch_all(conn)
        .await
}

/// Lets go of `held` (part, fence).
pub(crate) async fn release(
    conn: &mut PgConnection,
    subscription: &str,
    holder: &str,
    held: &[(i32, i64)],
) -> sqlx::Result<()> {
    let (parts, fences): (Vec<i32>, Vec<i64>) = held.iter().copied().unzip();
    sqlx::query(include_str!("sql/event_release.sql"))
        .bind(subscription)
        .bind(holder)
        .bind(parts)
        .bind(fences)
        .execute(conn)
        .await?;
    Ok(())
}

/// A batch and the cursor it leads to once published.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) next: Cursor,
    pub(crate) events: Vec<LogEvent>,
    /// For [`Settled::observe`]; none when the read found nothing to do.
    pub(crate) mark: Option<Mark>,
}

/// The next batch after `cursor` of partition `part` of `partitions`: at
/// most `limit` positions further, or, over positions at or below
/// `settled`, at most `limit` events further. Two statements, the
/// sequence's last value first, so that every position the batch can cut
/// at was drawn before the second one's snapshot (see event_read.sql).
///
/// Refuses to read (`sqlx::Error::Configuration`, on which the relay
/// stops until the sequence is put right) while the sequence is not what
/// every cut relies on (see [`head_problem`]), or when it went below what
/// this partition's reads have seen.
pub(crate) async fn read(
    conn: &mut PgConnection,
    cursor: &Cursor,
    limit: i64,
    settled: &Settled,
    stream: &str,
    partitions: i32,
    part: i32,
) -> sqlx::Result<Batch> {
    use sqlx::{Column, Row};
    let (last, cache, increment): (i64, i64, i64) =
        sqlx::query_as(include_str!("sql/event_last_position.sql"))
            .fetch_one(&mut *conn)
            .await?;
    if let Some(problem) = head_problem(last, cache, increment, cursor.position.max(settled.seen)) {
        return Err(sqlx::Error::Configuration(problem.into()));
    }
    let settled = settled.position();
    let end = last
        .min(cursor.position.saturating_add(limit))
        .max(settled.min(last))
        .max(cursor.position);
    if end == cursor.position && cursor.gaps.is_empty() {
        return Ok(Batch {
            next: cursor.clone(),
            events: Vec::new(),
            mark: None,
        });
    }
    let rows = sqlx::query(include_str!("sql/event_read.sql"))
        .bind(cursor.position)
        .bind(end)
        .bind(&cursor.gaps)
        .bind(stream)
        .bind(partitions)
        .bind(part)
        .bind(limit)
        .fetch_all(conn)
        .await?;
    let (mut xmin, mut next_xid) = (0, 0);
    let mut visible = Vec::with_capacity(rows.len());
    let mut events = Vec::new();
    if let Some(first) = rows.first() {
        let (xmin_at, next_xid_at, mine_at) = (
            first.try_column("xmin")?.ordinal(),
            first.try_column("next_xid")?.ordinal(),
            first.try_column("mine")?.ordinal(),
        );
        // Every row carries the cut's xmin and next xid: the first is read.
        xmin = first.try_get(xmin_at)?;
        next_xid = first.try_get(next_xid_at)?;
        let columns = EventColumns::of(first)?;
        for row in &rows {
            // The one row of an empty batch has no event.
            let Some(position) = row.try_get::<Option<i64>, _>(columns.position)? else {
                continue;
            };
            visible.push(position);
            if row.try_get::<bool, _>(mine_at)? {
                events.push(columns.event(row)?);
            }
        }
    }
    // A read over settled positions stops at its `limit`th event: the
    // rest is for the next one.
    let past = visible.partition_point(|&p| p <= cursor.position);
    let end = match visible.get(past..) {
        Some(new) if new.len() as i64 >= limit => new[new.len() - 1],
        _ => end,
    };
    let next = cursor.after(end, xmin, next_xid, &visible, settled);
    if tracing::enabled!(tracing::Level::DEBUG) {
        log_forgotten(cursor, &next, &visible, xmin);
    }
    Ok(Batch {
        next,
        events,
        mark: Some(Mark {
            last,
            next_xid,
            xmin,
        }),
    })
}

/// Logs the gaps a read gave up as rolled back: rare, since a rollback
/// after an emit is, and the first thing to look at if an event is ever
/// missed. (Both lists are sorted: the kept gaps come before the new ones.)
fn log_forgotten(before: &Cursor, after: &Cursor, visible: &[i64], xmin: i64) {
    let forgotten: Vec<i64> = before
        .gaps
        .iter()
        .copied()
        .filter(|p| visible.binary_search(p).is_err() && after.gaps.binary_search(p).is_err())
        .collect();
    if let (Some(first), Some(last)) = (forgotten.first(), forgotten.last()) {
        tracing::debug!(
            count = forgotten.len(),
            first,
            last,
            xmin,
            "gaps given up: their transactions ended without committing"
        );
    }
}

/// Why a relay must not read the log as it stands, if it must not: the
/// position sequence's `last` value, `cache` and `increment`, and the
/// highest position a reader has already passed (`passed`).
///
/// Every cut assumes that a position at or below the sequence's last value
/// was drawn by a transaction that already had its id (see event_read.sql)
/// and that positions only grow:
/// - A cache above 1 hands each session a run of positions to draw later,
///   by transactions that start after a read cut past them: the read keeps
///   them as gaps bounded by the wrong transaction id, and gives them up as
///   rolled back while their events are still to come. It also breaks the
///   aggregates' commit order, which the emit lock draws positions in.
/// - Another increment leaves every other position empty, a gap each.
/// - A sequence behind a reader (setval, or a restore or a logical
///   replica that left it behind) draws positions the reader has passed:
///   their events would never be published.
///
/// The relay reads nothing while one of these holds, rather than lose
/// events without a word; `events subscriptions` shows the same text.
pub(crate) fn head_problem(last: i64, cache: i64, increment: i64, passed: i64) -> Option<String> {
    const SEQ: &str = "outbox_event_position_seq";
    if cache != 1 {
        return Some(format!(
            "the event log's position sequence caches {cache} positions per session \
             (it must be 1): sessions would draw positions after a relay cut past them, \
             and their events would be passed over. Relays read nothing until \
             `ALTER SEQUENCE {SEQ} CACHE 1` (which also makes every session drop the \
             positions it cached)"
        ));
    }
    if increment != 1 {
        return Some(format!(
            "the event log's position sequence increments by {increment} (it must be 1). \
             Relays read nothing until `ALTER SEQUENCE {SEQ} INCREMENT BY 1`"
        ));
    }
    if last < passed {
        return Some(format!(
            "the event log's position sequence is at {last}, behind position {passed} \
             that a relay has read past: it was set back (setval, or a restore or a \
             logical replica that left it behind), and events emitted now would be \
             passed over. Relays read nothing until it is past every position in \
             the log and every relay's cursor: `SELECT setval('{SEQ}', \
             greatest((SELECT max(position) FROM outbox_event_log), \
             (SELECT max(position) FROM outbox_event_cursors)))`; events emitted \
             meanwhile sit below the cursors and are not published"
        ));
    }
    None
}

/// Moves the cursor after `published` events, fenced; false when the
/// lease was lost.
pub(crate) async fn advance(
    conn: &mut PgConnection,
    at: Holder<'_>,
    next: &Cursor,
    published: i64,
    ttl_us: i64,
) -> sqlx::Result<bool> {
    let row: Option<i32> = sqlx::query_scalar(include_str!("sql/event_advance.sql"))
        .bind(at.subscription)
        .bind(at.part)
        .bind(at.holder)
        .bind(at.fence)
        .bind(&next.gaps)
        .bind(next.position)
        .bind(published)
        .bind(ttl_us)
        .bind(&next.gap_bounds)
        .fetch_optional(conn)
        .await?;
    Ok(row.is_some())
}

/// An event to hold back, with when to try it again and why.
#[derive(Debug, Clone)]
pub(crate) struct Parking {
    pub(crate) event: LogEvent,
    pub(crate) retry_at: Option<DateTime<Utc>>,
    pub(crate) error: Option<String>,
}

/// Holds `events` back, fenced.
pub(crate) async fn park(
    conn: &mut PgConnection,
    at: Holder<'_>,
    events: &[Parking],
) -> sqlx::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let col = |f: fn(&Parking) -> Option<String>| events.iter().map(f).collect::<Vec<_>>();
    sqlx::query(include_str!("sql/event_park.sql"))
        .bind(at.subscription)
        .bind(at.part)
        .bind(at.holder)
        .bind(at.fence)
        .bind(events.iter().map(|p| p.event.position).collect::<Vec<_>>())
        .bind(col(|p| Some(p.event.id.clone())))
        .bind(col(|p| Some(p.event.aggregatetype.clone())))
        .bind(col(|p| Some(p.event.aggregateid.clone())))
        .bind(col(|p| Some(p.event.event_type.clone())))
        .bind(
            events
                .iter()
                .map(|p| p.event.payload.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|p| p.event.headers.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|p| p.event.publish_at)
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|p| p.event.aggregate_hash)
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|p| p.event.created_at)
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|p| p.retry_at).collect::<Vec<_>>())
        .bind(col(|p| p.error.clone()))
        .execute(conn)
        .await?;
    Ok(())
}

/// The aggregates of a partition held back, read whole; puts right what a
/// race with an operator may have left of the held-back events' times
/// (the sweep, see `event_parked_aggregates.sql`).
pub(crate) async fn parked_aggregates(
    conn: &mut PgConnection,
    subscription: &str,
    partitions: i32,
    part: i32,
) -> sqlx::Result<Vec<(String, String)>> {
    sqlx::query_as(include_str!("sql/event_parked_aggregates.sql"))
        .bind(subscription)
        .bind(partitions)
        .bind(part)
        .fetch_all(conn)
        .await
}

/// When the first aggregate a partition holds back is due to be tried
/// again, if any has a time; and the database's time.
pub(crate) async fn parked_soonest(
    conn: &mut PgConnection,
    subscription: &str,
    partitions: i32,
    part: i32,
) -> sqlx::Result<(Option<DateTime<Utc>>, DateTime<Utc>)> {
    sqlx::query_as(include_str!("sql/event_parked_soonest.sql"))
        .bind(subscription)
        .bind(partitions)
        .bind(part)
        .fetch_one(conn)
        .await
}

/// Held-back events of a partition due to be tried again, in order, and
/// for each of their aggregates how many of its held-back events the read
/// found: when fewer of them were returned, it holds back more than these.
pub(crate) struct ParkedDue {
    pub(crate) events: Vec<LogEvent>,
    pub(crate) held: HashMap<(String, String), i64>,
    /// The version (`xmin`) of each event's row the look read, by
    /// position: an operator's retry since then is kept by the unpark.
    pub(crate) seen: HashMap<i64, String>,
}

/// Reads a partition's held-back events due to be tried again.
pub(crate) async fn parked_due(
    conn: &mut PgConnection,
    subscription: &str,
    partitions: i32,
    part: i32,
    limit: i64,
) -> sqlx::Result<ParkedDue> {
    use sqlx::{Column, Row};
    let rows = sqlx::query(include_str!("sql/event_parked_due.sql"))
        .bind(subscription)
        .bind(partitions)
        .bind(part)
        .bind(limit)
        .fetch_all(conn)
        .await?;
    let mut events = Vec::with_capacity(rows.len());
    let mut held = HashMap::new();
    let mut seen = HashMap::with_capacity(rows.len());
    if let Some(first) = rows.first() {
        let columns = EventColumns::of(first)?;
        let held_at = first.try_column("held")?.ordinal();
        let seen_at = first.try_column("seen")?.ordinal();
        for row in &rows {
            let event = columns.event(row)?;
            held.insert(
                (event.aggregatetype.clone(), event.aggregateid.clone()),
                row.try_get::<i64, _>(held_at)?,
            );
            seen.insert(event.position, row.try_get::<String, _>(seen_at)?);
            events.push(event);
        }
    }
    Ok(ParkedDue { events, held, seen })
}

/// What became of held-back events tried again: those `published` went
/// out; for each aggregate refused or not due again, its first event left
/// (`again`) is tried again at `retry_at` with `error` (three columns of
/// one list). `cut` holds each aggregate whose events were all published
/// but may have more that the look did not read.
#[derive(Debug, Default)]
pub(crate) struct Unparked {
    pub(crate) cut: Vec<(String, String)>,
    pub(crate) published: Vec<i64>,
    pub(crate) again: Vec<i64>,
    pub(crate) retry_at: Vec<Option<DateTime<Utc>>>,
    pub(crate) error: Vec<Option<String>>,
    /// The version of each `again` event's row the look read
    /// ([`ParkedDue::seen`]; none when it did not read it).
    pub(crate) seen: Vec<Option<String>>,
}

/// Writes what became of held-back events tried again, fenced. False when
/// the lease was lost.
pub(crate) async fn unpark(
    conn: &mut PgConnection,
    at: Holder<'_>,
    outcome: &Unparked,
) -> sqlx::Result<bool> {
    let (cut_types, cut_ids): (Vec<&str>, Vec<&str>) = outcome
        .cut
        .iter()
        .map(|(t, i)| (t.as_str(), i.as_str()))
        .unzip();
    let row: Option<i32> = sqlx::query_scalar(include_str!("sql/event_unpark.sql"))
        .bind(at.subscription)
        .bind(at.part)
        .bind(at.holder)
        .bind(at.fence)
        .bind(&outcome.published)
        .bind(&outcome.again)
        .bind(&outcome.retry_at)
        .bind(&outcome.error)
        .bind(cut_types)
        .bind(cut_ids)
        .bind(&outcome.seen)
        .fetch_optional(conn)
        .await?;
    Ok(row.is_some())
}

/// Makes sure a partition of the log covers each time `ahead_us` from now
/// (`width_us` wide); returns how many were made.
pub(crate) async fn prepare(
    conn: &mut PgConnection,
    ahead_us: i64,
    width_us: i64,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<u64> {
    super::cover_ahead(
        conn,
        include_str!("sql/event_log_cover.sql"),
        ahead_us,
        width_us,
        now,
    )
    .await
}

/// Drops partitions every subscription has passed (ended `quiet_us` ago at
/// least), or that ended `max_age_us` ago whatever they say, at most
/// `limit`; returns their names and whether each was forced.
pub(crate) async fn drop_passed(
    conn: &mut PgConnection,
    quiet_us: i64,
    max_age_us: i64,
    limit: usize,
    now: Option<DateTime<Utc>>,
) -> sqlx::Result<Vec<(String, bool)>> {
    let mut dropped = Vec::new();
    while dropped.len() < limit {
        let (name, forced): (Option<String>, Option<bool>) =
            sqlx::query_as(include_str!("sql/event_log_drop.sql"))
                .bind(quiet_us)
                .bind(max_age_us)
                .bind(now)
                .fetch_one(&mut *conn)
                .await?;
        match name {
            Some(name) => dropped.push((name, forced.unwrap_or(false))),
            None => break,
        }
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::{Cursor, Mark, Settled, head_problem};

    #[test]
    fn a_read_fills_keeps_and_forgets_gaps_and_opens_new_ones() {
        let cursor = Cursor {
            position: 10,
            gaps: vec![3, 5, 7],
            gap_bounds: vec![100, 100, 200],
        };
        // Visible now: gap 3, and 11, 13 of (10, 14]. xmin 150: every
        // transaction below 150 has ended, so gap 5 (bound 100), still not
        // visible, was rolled back; gap 7 (bound 200) may still be open.
        let next = cursor.after(14, 150, 300, &[3, 11, 13], 0);
        assert_eq!(next.position, 14);
        assert_eq!(next.gaps, vec![7, 12, 14]);
        assert_eq!(next.gap_bounds, vec![200, 300, 300]);
        // Nothing new, nothing visible, nothing ended: the same cursor.
        assert_eq!(next.after(14, 150, 400, &[], 0), next);
        // Settled up to 12: gaps 7 and 12 will never fill, 14 still may.
        let settled = next.after(14, 150, 400, &[], 12);
        assert_eq!(settled.gaps, vec![14]);
        assert_eq!(settled.gap_bounds, vec![300]);
    }

    #[test]
    fn a_read_is_refused_while_the_sequence_caches_steps_or_went_back() {
        assert_eq!(head_problem(100, 1, 1, 100), None);
        assert_eq!(head_problem(100, 1, 1, 0), None);
        let cached = head_problem(100, 20, 1, 0).expect("a cache is refused");
        assert!(cached.contains("caches 20 positions") && cached.contains("CACHE 1"));
        let stepped = head_problem(100, 1, 2, 0).expect("a step of 2 is refused");
        assert!(stepped.contains("INCREMENT BY 1"));
        let back = head_problem(5, 1, 1, 100).expect("a sequence behind is refused");
        assert!(back.contains("is at 5, behind position 100") && back.contains("setval"));
    }

    #[test]
    fn a_read_over_settled_positions_keeps_no_gap_for_them() {
        // From 10 to 1,000, settled up to 990: only 991-1,000 can still
        // fill (995 did).
        let cursor = Cursor {
            position: 10,
            ..Cursor::default()
        };
        let next = cursor.after(1000, 150, 300, &[500, 995], 990);
        assert_eq!(next.position, 1000);
        assert_eq!(
            next.gaps,
            vec![991, 992, 993, 994, 996, 997, 998, 999, 1000]
        );
    }

    #[test]
    fn a_mark_settles_once_a_snapshot_passes_its_transaction_id() {
        let mut settled = Settled::default();
        let mark = |last, next_xid, xmin| Mark {
            last,
            next_xid,
            xmin,
        };
        // Transaction 90 was open when the first read took its snapshot.
        settled.observe(mark(1000, 100, 90));
        assert_eq!(settled.position(), 0);
        settled.observe(mark(2000, 120, 95));
        assert_eq!(settled.position(), 0);
        // Every transaction below 100 has ended; below 120 not yet.
        settled.observe(mark(2500, 130, 110));
        assert_eq!(settled.position(), 1000);
        // Nothing open at all: this read's own mark settles at once.
        settled.observe(mark(3000, 140, 140));
        assert_eq!(settled.position(), 3000);
        // Many reads behind one open transaction: the marks kept are
        // bounded, and the newest still settles.
        for i in 0..1000 {
            settled.observe(mark(4000 + i, 200 + i, 150));
        }
        assert!(settled.marks.len() <= Settled::MARKS);
        settled.observe(mark(6000, 1300, 1300));
        assert_eq!(settled.position(), 6000);
    }
}
