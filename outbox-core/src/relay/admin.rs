//! What operators see of subscriptions, and what they do about parked
//! aggregates: one place the CLI, the dashboard and the metrics read.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::error::Result;

/// One subscription and how far behind it is.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Subscription {
    /// Its name (its relay's).
    pub name: String,
    /// The stream it reads.
    pub stream: String,
    /// How many partitions its aggregates are split into.
    pub partitions: i32,
    /// Its slowest partition's position.
    pub position: i64,
    /// Events of its stream past that position (counted up to a million).
    pub behind: i64,
    /// How long the oldest of them has waited, in seconds.
    pub lag_s: f64,
    /// Relay workers holding a partition now.
    pub holders: i64,
    /// Events it has published.
    pub published: i64,
    /// Events it holds back (parked aggregates' events): refused ones, the
    /// events behind them, and events whose delay has not run out.
    pub parked: i64,
    /// Aggregates it holds back, for any of those reasons.
    pub parked_aggregates: i64,
    /// Of those, the aggregates held back by an event the broker refused:
    /// they wait for an operator's retry or skip. (The others go on by
    /// themselves once their delays run out.)
    pub refused_aggregates: i64,
    /// The log's last position.
    pub head: i64,
    /// How long its relay's publishes have failed for now, in seconds (a
    /// broker down, timing out, answering 5xx: transient failures with no
    /// success since), the longest of its live relay workers; none while
    /// they succeed. Events wait meanwhile, and none is lost.
    pub failing_s: Option<f64>,
    /// The last reason those publishes failed.
    pub failing: Option<String>,
    /// Why its relay reads nothing, if the log's position sequence is not
    /// as every relay needs it: caching, stepping by more than one, or set
    /// back behind a partition's position. It says how to put it right.
    pub problem: Option<String>,
}

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for Subscription {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> sqlx::Result<Self> {
        use sqlx::Row;
        Ok(Self {
            name: row.try_get("name")?,
            stream: row.try_get("stream")?,
            partitions: row.try_get("partitions")?,
            position: row.try_get("position")?,
            behind: row.try_get("behind")?,
            lag_s: row.try_get("lag_s")?,
            holders: row.try_get("holders")?,
            published: row.try_get("published")?,
            parked: row.try_get("parked")?,
            parked_aggregates: row.try_get("parked_aggregates")?,
            refused_aggregates: row.try_get("refused_aggregates")?,
            head: row.try_get("head")?,
            failing_s: row.try_get("failing_s")?,
            failing: row.try_get("failing_why")?,
            problem: crate::db::event_log::head_problem(
                row.try_get("head")?,
                row.try_get("sequence_cache")?,
                row.try_get("sequence_increment")?,
                row.try_get("furthest")?,
            ),
        })
    }
}

/// Every subscription, by name.
pub async fn subscriptions(pool: &PgPool) -> Result<Vec<Subscription>> {
    Ok(crate::pooler::on(pool, async |conn| {
        sqlx::query_as(include_str!("../db/sql/event_subscriptions.sql"))
            .fetch_all(conn)
            .await
    })
    .await?)
}

/// A held-back event.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ParkedEvent {
    /// The subscription holding it back.
    pub subscription: String,
    /// Its aggregate's type.
    pub aggregatetype: String,
    /// Its aggregate's id.
    pub aggregateid: String,
    /// Its position in the log.
    pub position: i64,
    /// Its event id.
    pub id: String,
    /// Its event type.
    pub event_type: String,
    /// When it was held back.
    pub parked_at: DateTime<Utc>,
    /// When the relay tries it again; none: when an operator says so. Only
    /// the first of an aggregate's held-back events has a time: the others
    /// have none while they wait behind it.
    pub retry_at: Option<DateTime<Utc>>,
    /// Why the broker refused it (the first of a parked aggregate).
    pub error: Option<String>,
    /// Not published before this time (its own delay), if it has one.
    pub publish_at: Option<DateTime<Utc>>,
}

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for ParkedEvent {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> sqlx::Result<Self> {
        use sqlx::Row;
        Ok(Self {
            subscription: row.try_get("subscription")?,
            aggregatetype: row.try_get("aggregatetype")?,
            aggregateid: row.try_get("aggregateid")?,
            position: row.try_get("position")?,
            id: row.try_get("id")?,
            event_type: row.try_get("type")?,
            parked_at: row.try_get("parked_at")?,
            retry_at: row.try_get("retry_at")?,
            error: row.try_get("error")?,
            publish_at: row.try_get("publish_at")?,
        })
    }
}

/// Held-back events of `subscription` (every one when none), each
/// aggregate's in order, at most `limit`.
pub async fn parked(
    pool: &PgPool,
    subscription: Option<&str>,
    limit: i64,
) -> Result<Vec<ParkedEvent>> {
    Ok(crate::pooler::on(pool, async |conn| {
        sqlx::query_as(include_str!("../db/sql/event_parked_list.sql"))
            .bind(subscription)
            .bind(limit)
            .fetch_all(conn)
            .await
    })
    .await?)
}

/// Tries a parked aggregate again now, from its first held-back event;
/// returns that event's id, or none when nothing is held back for it.
pub async fn retry_parked(
    pool: &PgPool,
    subscription: &str,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<Option<String>> {
    parked_action(
        pool,
        subscription,
        aggregate_type,
        aggregate_id,
        Act::Retry { cut_delay_of: None },
    )
    .await
}

/// [`retry_parked`], and when the aggregate's first held-back event waits
/// for its own delay ([`crate::events::Event::delay`]), publishes it now
/// all the same: for a delay given by mistake (a year instead of an
/// hour), which would hold its aggregate's later events back with it.
/// Only when that first event is `event_id` (the one the operator saw):
/// once it has gone out, a stale or repeated call does nothing and returns
/// none, rather than cutting short the next event's delay, which may be
/// meant. A malformed id is an error.
pub async fn retry_parked_now(
    pool: &PgPool,
    subscription: &str,
    aggregate_type: &str,
    aggregate_id: &str,
    event_id: &str,
) -> Result<Option<String>> {
    let id = canonical_event_id(event_id)?;
    parked_action(
        pool,
        subscription,
        aggregate_type,
        aggregate_id,
        Act::Retry {
            cut_delay_of: Some(&id),
        },
    )
    .await
}

/// Tries every aggregate that `subscription`'s broker refused again now
/// (only those of `aggregate_type`, when given), each from its first
/// held-back event, as [`retry_parked`] does for one: after a fix on the
/// broker's side (a webhook that answered 400 to everything) that
/// refused many. Delayed aggregates keep their time. Returns how many
/// aggregates it asked to be tried.
pub async fn retry_all_parked(
    pool: &PgPool,
    subscription: &str,
    aggregate_type: Option<&str>,
) -> Result<u64> {
    let retried: i64 = crate::pooler::on(pool, async |conn| {
        sqlx::query_scalar(include_str!("../db/sql/event_parked_retry_all.sql"))
            .bind(subscription)
            .bind(aggregate_type)
            .fetch_one(conn)
            .await
    })
    .await?;
    Ok(u64::try_from(retried).unwrap_or(0))
}

/// When held-back event `event_id` of `subscription` is due by its own
/// delay ([`crate::events::Event::delay`]), if that is still ahead: a
/// retry does not cut a delay short ([`retry_parked_now`] does). None when it is not delayed, its
/// delay has run out, or it is not held back.
pub async fn delayed_until(
    pool: &PgPool,
    subscription: &str,
    event_id: &str,
) -> Result<Option<DateTime<Utc>>> {
    let Ok(id) = canonical_event_id(event_id) else {
        return Ok(None);
    };
    Ok(crate::pooler::on(pool, async |conn| {
        sqlx::query_scalar(
            "SELECT publish_at FROM outbox_event_parked \
             WHERE subscription = $1 AND id = $2::uuid AND publish_at > now()",
        )
        .bind(subscription)
        .bind(&id)
        .fetch_optional(conn)
        .await
    })
    .await?)
}

/// Drops a parked aggregate's first held-back event if the broker refused
/// it, and tries the rest now; returns the dropped event's id, or none
/// when nothing is held back for it or its first event was not refused (a
/// delayed one, or the next one after a skip, which is being tried).
///
/// It drops whichever event is refused first when it runs: repeated after
/// the relay tried the next event and the broker refused that one too, it
/// drops that one as well. Use [`skip_parked_event`] to name the event, as
/// an operator who looked at it should (the CLI and the dashboard do):
/// the first event can change between the look and the skip.
pub async fn skip_parked(
    pool: &PgPool,
    subscription: &str,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<Option<String>> {
    parked_action(
        pool,
        subscription,
        aggregate_type,
        aggregate_id,
        Act::Skip { event_id: None },
    )
    .await
}

/// [`skip_parked`], only when the first held-back event is `event_id`: a
/// stale or repeated skip (a double click, two operators, a retry that
/// got the refused event out while the next one was refused) drops
/// nothing and returns none. Named so, a first event still waiting for
/// its own delay is dropped too (never published), and the aggregate's
/// later events go next. A malformed id is an error.
pub async fn skip_parked_event(
    pool: &PgPool,
    subscription: &str,
    aggregate_type: &str,
    aggregate_id: &str,
    event_id: &str,
) -> Result<Option<String>> {
    let id = canonical_event_id(event_id)?;
    parked_action(
        pool,
        subscription,
        aggregate_type,
        aggregate_id,
        Act::Skip {
            event_id: Some(&id),
        },
    )
    .await
}

/// An event id an operator gave, in its canonical text: the parse takes
/// some forms PostgreSQL's does not.
pub(super) fn canonical_event_id(event_id: &str) -> Result<String> {
    crate::events::parse_uuid(event_id)
        .map(|bytes| crate::events::format_uuid(&bytes))
        .ok_or_else(|| crate::Error::InvalidOption(format!("event id {event_id:?} is not a UUID")))
}

/// What an operator does to one parked aggregate.
enum Act<'a> {
    /// Try it again now; `cut_delay_of` names the first event, to publish
    /// it now though it waits for its delay (nothing is done when it is
    /// not first).
    Retry { cut_delay_of: Option<&'a str> },
    /// Drop its first event: a refused one, and only `event_id` when
    /// given (which may also be a delayed one).
    Skip { event_id: Option<&'a str> },
}

async fn parked_action(
    pool: &PgPool,
    subscription: &str,
    aggregate_type: &str,
    aggregate_id: &str,
    act: Act<'_>,
) -> Result<Option<String>> {
    let (skip, event_id, cut_delay) = match act {
        Act::Retry { cut_delay_of } => (false, cut_delay_of, cut_delay_of.is_some()),
        Act::Skip { event_id } => (true, event_id, false),
    };
    Ok(crate::pooler::on(pool, async |conn| {
        sqlx::query_scalar(include_str!("../db/sql/event_parked_retry.sql"))
            .bind(subscription)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(skip)
            .bind(event_id)
            .bind(cut_delay)
            .fetch_optional(conn)
            .await
    })
    .await?)
}

/// Why every relay reads nothing, if they do: the log's position sequence
/// caches, steps by more than one, or is behind a cursor (the message of
/// [`Subscription::problem`], with its fix). Two index lookups, for a
/// caller that wants only this and not [`subscriptions`]' counts.
pub async fn sequence_problem(pool: &PgPool) -> Result<Option<String>> {
    Ok(crate::pooler::on(pool, async |conn| {
        let (last, cache, increment): (i64, i64, i64) =
            sqlx::query_as(include_str!("../db/sql/event_last_position.sql"))
                .fetch_one(&mut *conn)
                .await?;
        let furthest: i64 =
            sqlx::query_scalar("SELECT coalesce(max(position), 0) FROM outbox_event_cursors")
                .fetch_one(&mut *conn)
                .await?;
        Ok(crate::db::event_log::head_problem(
            last, cache, increment, furthest,
        ))
    })
    .await?)
}

/// Whether a subscription named `name` exists (without reading how far
/// behind it is, as [`subscriptions`] does).
pub async fn subscription_exists(pool: &PgPool, name: &str) -> Result<bool> {
    Ok(subscription_record(pool, name).await?.is_some())
}

/// Whether any subscription reads `stream` (a relay's `queue`; `events`
/// unless it says otherwise). An event emitted to a stream no
/// subscription reads waits in the log for a relay that does, until the
/// log's maximum age.
pub async fn stream_has_subscription(pool: &PgPool, stream: &str) -> Result<bool> {
    Ok(crate::pooler::on(pool, async |conn| {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM outbox_event_subscriptions WHERE stream = $1)",
        )
        .bind(stream)
        .fetch_one(conn)
        .await
    })
    .await?)
}

/// What a subscription recorded when it was created: the stream it reads
/// and the kind of sink it publishes to. A relay of its name that names
/// another stream, or has another kind of sink, does not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionRecord {
    /// The stream it reads (a relay's `queue`).
    pub stream: String,
    /// `nats`, `kafka`, `rabbitmq`, `redis`, `webhook`, or a custom sink's
    /// kind, as its first relay recorded it; none for a subscription made
    /// before migration 52 whose relay has not run since.
    pub sink: Option<String>,
}

/// What subscription `name` recorded; none when there is no such
/// subscription.
pub async fn subscription_record(pool: &PgPool, name: &str) -> Result<Option<SubscriptionRecord>> {
    let row: Option<(String, Option<String>)> = crate::pooler::on(pool, async |conn| {
        sqlx::query_as("SELECT stream, sink FROM outbox_event_subscriptions WHERE name = $1")
            .bind(name)
            .fetch_optional(conn)
            .await
    })
    .await?;
    Ok(row.map(|(stream, sink)| SubscriptionRecord { stream, sink }))
}

/// What [`delete_subscription`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The subscription, its cursors and its held-back events are gone.
    Deleted {
        /// How many events it held back (never published by it), gone
        /// with it.
        held_back: i64,
    },
    /// A relay worker is on it (alive, or holding a partition's lease,
    /// which a rewind leaves to run out): nothing was deleted. Stop that
    /// relay first; it would create the subscription again and publish
    /// the log from where a new one starts.
    Live,
    /// There is no subscription of that name.
    NotFound,
}

/// Moves subscription `name`'s cursors, every partition's, to `to` (as a
/// new subscription would start there): back, to publish retained events
/// again (a consumer lost its data), or forward, to pass a backlog no one
/// wants. Every partition's lease is taken back: a relay worker holding
/// one writes nothing more of it, and it or another takes it again from
/// the new cursor once the old lease has run out (the holder may publish
/// from the old cursor until its next renewal).
/// Events it held back past the new position go (they are read again);
/// those at or below it stay held back, as do the positions the cursors
/// were still waiting for below it. Returns the position the subscription
/// now publishes after, or none when there is no such subscription.
pub async fn rewind_subscription(
    pool: &PgPool,
    name: &str,
    to: super::Start,
) -> Result<Option<i64>> {
    Ok(crate::pooler::on(pool, async |conn| {
        crate::db::event_log::rewind(conn, name, to).await
    })
    .await?)
}

/// Deletes the subscription `name` (a relay's, by its name) with its
/// cursors and held-back events, so that retention no longer waits for it:
/// for a relay taken out of service, or moved to Debezium. Refused while a
/// relay worker is on it.
pub async fn delete_subscription(pool: &PgPool, name: &str) -> Result<Deleted> {
    let found: Option<(bool, i64)> = crate::pooler::on(pool, async |conn| {
        sqlx::query_as(include_str!("../db/sql/event_unsubscribe.sql"))
            .bind(name)
            .fetch_optional(conn)
            .await
    })
    .await?;
    Ok(match found {
        None => Deleted::NotFound,
        Some((true, _)) => Deleted::Live,
        Some((false, held_back)) => Deleted::Deleted { held_back },
    })
}
