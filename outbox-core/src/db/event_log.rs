//! Statements about the event log: subscriptions, their partitions'
//! leases and cursors, batches, held-back (parked) events, retention.

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
        use sqlx::Row;
        Ok(Self {
            position: row.try_get("position")?,
            id: row.try_get("id")?,
            aggregatetype: row.try_get("aggregatetype")?,
            aggregateid: row.try_get("aggregateid")?,
            event_type: row.try_get("type")?,
            payload: row.try_get("payload")?,
            headers: row.try_get("headers")?,
            publish_at: row.try_get("publish_at")?,
            created_at: row.try_get("created_at")?,
            aggregate_hash: row.try_get("aggregate_hash")?,
        })
    }
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
    /// at a gap.
    fn after(&self, end: i64, xmin: i64, next_xid: i64, visible: &[i64]) -> Cursor {
        let seen = |p: i64| visible.binary_search(&p).is_ok();
        let mut next = Cursor {
            position: end,
            ..Cursor::default()
        };
        for (&p, &bound) in self.gaps.iter().zip(&self.gap_bounds) {
            // Filled now, or its emitter has ended without committing.
            if !seen(p) && xmin < bound {
                next.gaps.push(p);
                next.gap_bounds.push(bound);
            }
        }
        for p in self.position + 1..=end {
            if !seen(p) {
                next.gaps.push(p);
                next.gap_bounds.push(next_xid);
            }
        }
        next
    }
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

/// Creates the subscription unless it exists; returns its stream and
/// partitions as recorded, or none when a concurrent creator got there
/// first (ask again).
pub(crate) async fn subscribe(
    conn: &mut PgConnection,
    name: &str,
    stream: &str,
    partitions: i32,
    from_head: bool,
) -> sqlx::Result<Option<(String, i32)>> {
    sqlx::query_as(include_str!("sql/event_subscribe.sql"))
        .bind(name)
        .bind(stream)
        .bind(partitions)
        .bind(from_head)
        .fetch_optional(conn)
        .await
}

/// Says `member` is alive for `ttl_us`; returns how many members are.
pub(crate) async fn member(
    conn: &mut PgConnection,
    subscription: &str,
    member: &str,
    ttl_us: i64,
) -> sqlx::Result<i64> {
    sqlx::query_scalar(include_str!("sql/event_member.sql"))
        .bind(subscription)
        .bind(member)
        .bind(ttl_us)
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
}

/// The next batch after `cursor` of partition `part` of `partitions`, at
/// most `limit` positions further: two statements, the sequence's last
/// value first, so that every position the batch can cut at was drawn
/// before the second one's snapshot (see event_read.sql).
pub(crate) async fn read(
    conn: &mut PgConnection,
    cursor: &Cursor,
    limit: i64,
    stream: &str,
    partitions: i32,
    part: i32,
) -> sqlx::Result<Batch> {
    use sqlx::{FromRow, Row};
    let last: i64 = sqlx::query_scalar(include_str!("sql/event_last_position.sql"))
        .fetch_one(&mut *conn)
        .await?;
    let end = last
        .min(cursor.position.saturating_add(limit))
        .max(cursor.position);
    if end == cursor.position && cursor.gaps.is_empty() {
        return Ok(Batch {
            next: cursor.clone(),
            events: Vec::new(),
        });
    }
    let rows = sqlx::query(include_str!("sql/event_read.sql"))
        .bind(cursor.position)
        .bind(end)
        .bind(&cursor.gaps)
        .bind(stream)
        .bind(partitions)
        .bind(part)
        .fetch_all(conn)
        .await?;
    let (mut xmin, mut next_xid) = (0, 0);
    let mut visible = Vec::with_capacity(rows.len());
    let mut events = Vec::new();
    for row in rows {
        xmin = row.try_get("xmin")?;
        next_xid = row.try_get("next_xid")?;
        // The one row of an empty batch has no event.
        let Some(position) = row.try_get::<Option<i64>, _>("position")? else {
            continue;
        };
        visible.push(position);
        if row.try_get::<bool, _>("mine")? {
            events.push(LogEvent::from_row(&row)?);
        }
    }
    let next = cursor.after(end, xmin, next_xid, &visible);
    if tracing::enabled!(tracing::Level::DEBUG) {
        log_forgotten(cursor, &next, &visible, xmin);
    }
    Ok(Batch { next, events })
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

/// The aggregates of a partition held back.
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

/// Held-back events of a partition due to be tried again, in order.
pub(crate) async fn parked_due(
    conn: &mut PgConnection,
    subscription: &str,
    partitions: i32,
    part: i32,
    limit: i64,
) -> sqlx::Result<Vec<LogEvent>> {
    sqlx::query_as(include_str!("sql/event_parked_due.sql"))
        .bind(subscription)
        .bind(partitions)
        .bind(part)
        .bind(limit)
        .fetch_all(conn)
        .await
}

/// Held-back events `published` went out; `next` (the first left of its
/// aggregate) is tried again at `retry_at` with `error`. False when the
/// lease was lost.
pub(crate) async fn unpark(
    conn: &mut PgConnection,
    at: Holder<'_>,
    published: &[i64],
    next: Option<i64>,
    retry_at: Option<DateTime<Utc>>,
    error: Option<&str>,
) -> sqlx::Result<bool> {
    let row: Option<i32> = sqlx::query_scalar(include_str!("sql/event_unpark.sql"))
        .bind(at.subscription)
        .bind(at.part)
        .bind(at.holder)
        .bind(at.fence)
        .bind(published)
        .bind(next)
        .bind(retry_at)
        .bind(error)
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
    use super::Cursor;

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
        let next = cursor.after(14, 150, 300, &[3, 11, 13]);
        assert_eq!(next.position, 14);
        assert_eq!(next.gaps, vec![7, 12, 14]);
        assert_eq!(next.gap_bounds, vec![200, 300, 300]);
        // Nothing new, nothing visible, nothing ended: the same cursor.
        assert_eq!(next.after(14, 150, 400, &[]), next);
    }
}
