//! Running behind a connection pooler in transaction mode (PgBouncer's
//! `pool_mode = transaction`, and poolers like it), where a client session
//! is lent a server session for one transaction at a time.
//!
//! The worker's own sessions need only [`WorkerConfig::pooler`]
//! (`outbox-worker run --pooler`), or a pool [`mark`]ed as pooled: each of
//! its calls is then one transaction that carries its limits as `SET
//! LOCAL` and cleans up after itself, and it polls instead of LISTENing
//! unless it is given a direct connection for that
//! ([`WorkerConfig::listen_options`]).
//!
//! The application's pool, which submits and emits and which handlers use,
//! needs three things from the application:
//! - connect with [`session_options`]: no statement cache (a cached
//!   statement lives on one server session, and the next transaction may
//!   get another) and no startup parameter the pooler refuses;
//! - [`mark`] the pool, so that outbox's own functions that take it
//!   ([`crate::migrate`], [`crate::schema_status`], durable steps and
//!   signals in handlers) run their statements the same way;
//! - run every statement that has parameters inside a transaction begun
//!   with [`begin`] (which begins a plain one on a pool not marked, so the
//!   same code runs with and without a pooler), or through [`on`]. sqlx
//!   sends such a statement's Parse and its Bind in two round trips, which
//!   outside a transaction the pooler may send to two different servers;
//!   and sqlx names the statement on the server even with its cache off,
//!   in a sequence of its own per client session, so a second client lent
//!   the same server could meet a name that is taken. [`begin`] drops
//!   whatever statements the server holds before the transaction's first.
//!
//! PgBouncer 1.21 and later can track prepared statements itself
//! (`max_prepared_statements`); with that on, the application's pool can
//! keep sqlx's statement cache. Only PgBouncer 1.18 (Debian 12's) is
//! tested here.
//!
//! [`WorkerConfig::pooler`]: crate::WorkerConfig::pooler
//! [`WorkerConfig::listen_options`]: crate::WorkerConfig::listen_options

use std::sync::{Arc, Mutex, Weak};

use sqlx::postgres::PgConnectOptions;
use sqlx::{PgConnection, PgPool, PgTransaction};

/// The statement [`begin`] opens a transaction with on a [`mark`]ed pool.
pub const BEGIN: &str = "BEGIN; DEALLOCATE ALL";

/// `options` fit for a session through a transaction-mode pooler: no
/// statement cache, and no `extra_float_digits` startup parameter (which
/// PgBouncer refuses unless told to ignore it; servers since PostgreSQL 12
/// send floats exactly without it).
pub fn session_options(options: PgConnectOptions) -> PgConnectOptions {
    options.statement_cache_capacity(0).extra_float_digits(None)
}

/// Begins a transaction on `pool` that is safe through a transaction-mode
/// pooler when the pool is [`mark`]ed (see the module's documentation),
/// and a plain one otherwise, so the same code runs either way: submit,
/// emit and write your own rows in it, then commit.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> outbox::Result<()> {
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Welcome { user: i64 }
/// # impl outbox::Task for Welcome { const TASK_TYPE: &'static str = "welcome"; }
/// let mut tx = outbox::pooler::begin(&pool).await?;
/// outbox::submit(&mut tx, Welcome { user: 7 }).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn begin(pool: &PgPool) -> sqlx::Result<PgTransaction<'static>> {
    if is_marked(pool) {
        // Not on a direct session: there, dropping the server's statements
        // would pull them from under sqlx's cache.
        pool.begin_with(BEGIN).await
    } else {
        pool.begin().await
    }
}

/// The pools [`mark`]ed as going through a pooler, by the identity of
/// their connect options (one `Arc` per pool, for its life).
static MARKED: Mutex<Vec<Weak<PgConnectOptions>>> = Mutex::new(Vec::new());

/// Marks `pool` as going through a transaction-mode pooler: outbox's own
/// functions that take it run their statements in transactions begun like
/// [`begin`], and a worker built on it behaves as with
/// [`WorkerConfig::pooler`](crate::WorkerConfig::pooler). Build the pool
/// with [`session_options`].
pub fn mark(pool: &PgPool) {
    let options = pool.connect_options();
    let mut marked = MARKED.lock().unwrap_or_else(|e| e.into_inner());
    marked.retain(|w| w.strong_count() > 0);
    if !marked.iter().any(|w| w.as_ptr() == Arc::as_ptr(&options)) {
        marked.push(Arc::downgrade(&options));
    }
}

/// Whether `pool` was [`mark`]ed as going through a pooler.
pub fn is_marked(pool: &PgPool) -> bool {
    let options = pool.connect_options();
    MARKED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|w| w.as_ptr() == Arc::as_ptr(&options))
}

/// Runs `work` on a connection of `pool`: in a transaction of its own when
/// the pool is [`mark`]ed (the only way a statement with parameters gets
/// through the pooler intact), as it comes otherwise. For statements that
/// would run on the pool directly without a pooler:
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> sqlx::Result<()> {
/// let dead: i64 = outbox::pooler::on(&pool, async |conn| {
///     sqlx::query_scalar("SELECT count(*) FROM outbox_tasks WHERE dead_at IS NOT NULL AND queue = $1")
///         .bind("default")
///         .fetch_one(conn)
///         .await
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn on<T>(
    pool: &PgPool,
    work: impl AsyncFnOnce(&mut PgConnection) -> sqlx::Result<T>,
) -> sqlx::Result<T> {
    if is_marked(pool) {
        let mut tx = begin(pool).await?;
        let value = work(&mut tx).await?;
        tx.commit().await?;
        Ok(value)
    } else {
        work(&mut *pool.acquire().await?).await
    }
}
