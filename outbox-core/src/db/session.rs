//! The worker's own database sessions: a small pool whose connections carry
//! server-side limits from the moment they open, and [`call`], which runs
//! one unit of work under a client-side deadline.
//!
//! Two sides of one promise ("a silent peer is found in seconds"):
//! - the server ends any engine statement after `statement_timeout`, and
//!   drops a session whose client stopped answering TCP keepalives or
//!   acknowledging data (`tcp_keepalives_*`, `tcp_user_timeout`), so a
//!   half-open session cannot hold a lock or a transaction for hours;
//! - the client gives up on a call a moment after the server would have
//!   (`statement_timeout` + [`CLIENT_MARGIN`]) and throws the connection
//!   away instead of returning it to the pool.
//!
//! Behind a connection pooler in transaction mode (PgBouncer's
//! `pool_mode = transaction`) a client session is lent a server session
//! only for one transaction at a time, so nothing may live in the session:
//! - the limits cannot be startup options (the pooler refuses `options`),
//!   so every call runs as one transaction that opens with `SET LOCAL`s;
//! - sqlx sends a statement's Parse and its Bind in two round trips, each
//!   ended by a Sync, which outside a transaction the pooler may route to
//!   two different servers: inside one they share the server;
//! - sqlx names a statement on the server even with its cache off, and the
//!   name is only unique per client session: two clients lent the same
//!   server in turn would both create `sqlx_s_1`. Each call's transaction
//!   therefore starts and ends with `DEALLOCATE ALL` on the server it was
//!   lent (see [`crate::pooler`] for the application's side).

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

use super::classify::{deadline_exceeded, is_session_lost, is_transient};

/// How much longer the client waits than the server's statement_timeout,
/// so that a slow but alive server reports its own timeout first.
pub const CLIENT_MARGIN: Duration = Duration::from_secs(1);

/// The application_name prefix of every engine session (`outbox <worker
/// id>`), so operators can find a worker's sessions in pg_stat_activity.
pub const ENGINE_APPLICATION_NAME: &str = "outbox";

/// Limits on the worker's own database sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionLimits {
    /// Server-side statement_timeout of every engine statement.
    pub(crate) statement_timeout: Duration,
    /// How long a connection may go unanswered before either side drops it.
    pub(crate) keepalive: Duration,
    /// Whether the sessions go through a pooler in transaction mode.
    pub(crate) pooled: bool,
}

impl SessionLimits {
    /// How long the client waits for one call.
    pub(crate) fn deadline(&self) -> Duration {
        self.statement_timeout + CLIENT_MARGIN
    }

    /// `base` with the limits applied as startup options (in force from the
    /// first statement, and on every reconnect) and the engine's
    /// application_name. Behind a pooler, the settings that matter per
    /// statement go into [`SessionLimits::begin`] instead.
    pub(crate) fn apply(&self, base: &PgConnectOptions, worker_id: &str) -> PgConnectOptions {
        let base = base
            .clone()
            .application_name(&format!("{ENGINE_APPLICATION_NAME} {worker_id}"))
            // A statement that runs long is reported once by the worker as
            // an outage, not again by sqlx as a slow statement.
            .disable_statement_logging();
        if self.pooled {
            return crate::pooler::session_options(base);
        }
        base.options(self.settings())
    }

    /// The settings every engine statement runs under.
    fn settings(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| d.as_millis().max(1).to_string();
        let secs = |d: Duration| d.as_secs().max(1).to_string();
        let mut settings = vec![
            ("statement_timeout", ms(self.statement_timeout)),
            // Ordering keys and queue limits take a lock and then look
            // with a fresh snapshot: only READ COMMITTED gives one,
            // whatever the database's default.
            ("default_transaction_isolation", "read committed".to_owned()),
            // The engine never leaves a transaction open between
            // statements; a session that does is stuck.
            (
                "idle_in_transaction_session_timeout",
                ms(self.deadline() * 2),
            ),
        ];
        if !self.pooled {
            // Probe an idle client after half the keepalive, every sixth of
            // it, three times; drop unacknowledged sends after the whole of
            // it. Ignored on Unix-socket sessions. (Behind a pooler the
            // server's client is the pooler: its own `tcp_keepalive`
            // settings watch the application's side.)
            settings.extend([
                ("tcp_keepalives_idle", secs(self.keepalive / 2)),
                ("tcp_keepalives_interval", secs(self.keepalive / 6)),
                ("tcp_keepalives_count", "3".to_owned()),
                ("tcp_user_timeout", ms(self.keepalive)),
            ]);
        }
        settings
    }

    /// Behind a pooler: the statement that opens each call's transaction,
    /// with the settings as `SET LOCAL` (the isolation level in the BEGIN)
    /// and the lent server's prepared statements dropped. None for direct
    /// sessions.
    fn begin(&self) -> Option<String> {
        self.pooled.then(|| {
            let mut sql = "BEGIN ISOLATION LEVEL READ COMMITTED".to_owned();
            for (name, value) in self.settings() {
                if name != "default_transaction_isolation" {
                    sql.push_str(&set_local(name, &value));
                }
            }
            sql.push_str("; DEALLOCATE ALL");
            sql
        })
    }

    /// The same limits on sessions that reach the server directly (a
    /// pooled worker's LISTEN connection).
    pub(crate) fn direct(&self) -> Self {
        Self {
            pooled: false,
            ..*self
        }
    }
}

/// `; SET LOCAL name = 'value'`, for settings the engine itself names.
fn set_local(name: &str, value: &str) -> String {
    debug_assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
    format!("; SET LOCAL {name} = '{}'", value.replace('\'', "''"))
}

/// The worker's own pool of sessions: `size` connections to the server of
/// the application's pool (same credentials and TLS), with the limits
/// applied. The application's pool stays untouched for its handlers.
///
/// Deliberately not a sqlx `Pool`: sqlx pings every connection it takes
/// back, without a deadline, so one connection going silent at the wrong
/// moment holds a pool slot forever (and `Pool::close` waits for it). Here
/// a healthy connection goes back as it is, and anything else is dropped.
pub(crate) struct EnginePool {
    options: PgConnectOptions,
    /// Behind a pooler, what opens every call's transaction.
    begin: Option<String>,
    idle: std::sync::Mutex<Vec<PgConnection>>,
    slots: tokio::sync::Semaphore,
}

impl EnginePool {
    pub(crate) fn new(
        application: &PgPool,
        worker_id: &str,
        limits: SessionLimits,
        size: usize,
    ) -> Self {
        Self {
            options: limits.apply(&application.connect_options(), worker_id),
            begin: limits.begin(),
            idle: std::sync::Mutex::default(),
            slots: tokio::sync::Semaphore::new(size.max(1)),
        }
    }

    /// The same pool with more settings on each session (added to the
    /// startup options, or behind a pooler to each call's BEGIN).
    pub(crate) fn with_settings(mut self, settings: &[(&str, &str)]) -> Self {
        match &mut self.begin {
            Some(begin) => {
                // Before the DEALLOCATE ALL that ends it.
                let at = begin.rfind("; DEALLOCATE ALL").unwrap_or(begin.len());
                let sets: String = settings.iter().map(|(n, v)| set_local(n, v)).collect();
                begin.insert_str(at, &sets);
            }
            None => self.options = self.options.options(settings.iter().copied()),
        }
        self
    }

    /// Whether the sessions go through a pooler in transaction mode.
    pub(crate) fn pooled(&self) -> bool {
        self.begin.is_some()
    }

    /// The connect options of the engine's sessions.
    pub(crate) fn options(&self) -> &PgConnectOptions {
        &self.options
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<PgConnection>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn checkout(&self) -> sqlx::Result<Checkout<'_>> {
        let slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let idle = self.idle().pop();
        let conn = match idle {
            Some(conn) => conn,
            None => PgConnection::connect_with(&self.options).await?,
        };
        Ok(Checkout {
            pool: self,
            conn: Some(conn),
            keep: false,
            _slot: slot,
        })
    }

    /// Drops the idle sessions without a word to the server: after a call
    /// found its session gone, they most likely are too (a restart or a
    /// failover ends every session at once). Each kept would cost some
    /// later call a failure, and its loop a backoff.
    fn forget_idle(&self) {
        let idle = std::mem::take(&mut *self.idle());
        drop(idle);
    }

    /// Closes the idle sessions politely, each within `deadline`.
    pub(crate) async fn close(&self, deadline: Duration) {
        let idle = std::mem::take(&mut *self.idle());
        for conn in idle {
            let _ = tokio::time::timeout(deadline, conn.close()).await;
        }
    }
}

/// A pool of one session for a LISTEN connection. sqlx pings a connection
/// when it goes back to its pool, which would hang on a silent socket, so
/// this pool closes released connections instead of keeping them.
pub(crate) fn listener_pool(options: &PgConnectOptions, acquire_timeout: Duration) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(acquire_timeout)
        .test_before_acquire(false)
        .after_release(|_, _| Box::pin(async { Ok(false) }))
        .connect_lazy_with(options.clone())
}

/// Runs `work` on a connection from `pool`, all of it (getting the
/// connection included) within `deadline`. A connection that missed the
/// deadline or failed with a transient error is discarded, not returned:
/// the next call gets a fresh one. When the error says the session itself
/// was lost (not merely late), the idle ones go too. `what` names the call
/// in the deadline error.
pub(crate) async fn call<T>(
    pool: &EnginePool,
    deadline: Duration,
    what: &'static str,
    work: impl AsyncFnOnce(&mut PgConnection) -> sqlx::Result<T>,
) -> sqlx::Result<T> {
    let attempt = async {
        let mut checkout = pool.checkout().await?;
        let result = match &pool.begin {
            None => work(checkout.conn()).await,
            Some(begin) => in_transaction(checkout.conn(), begin, work).await,
        };
        // A server-side rejection leaves the session healthy and idle.
        checkout.keep = match &result {
            Ok(_) => true,
            Err(e) => !is_transient(e),
        };
        result
    };
    match tokio::time::timeout(deadline, attempt).await {
        Ok(result) => {
            if let Err(error) = &result
                && is_session_lost(error)
            {
                pool.forget_idle();
            }
            result
        }
        // A missed deadline alone leaves the idle sessions: the server may
        // be slow rather than gone, and reconnecting them all would add to
        // its load. (Its own sessions' losses, reset or refused, and the
        // server's word that it went away, are told apart above.)
        Err(_) => Err(deadline_exceeded(what, deadline)),
    }
}

/// Runs `work` as one transaction opened by `begin`, leaving no prepared
/// statement behind on the server the pooler lent: `work`'s own
/// transactions become savepoints of it. A failed `work` is rolled back
/// before its error is returned; a failed rollback is returned instead (a
/// broken session, which the caller then drops).
async fn in_transaction<T>(
    conn: &mut PgConnection,
    begin: &str,
    work: impl AsyncFnOnce(&mut PgConnection) -> sqlx::Result<T>,
) -> sqlx::Result<T> {
    let mut tx = conn
        .begin_with(sqlx::AssertSqlSafe(begin.to_owned()))
        .await?;
    match work(&mut tx).await {
        Ok(value) => {
            sqlx::raw_sql("DEALLOCATE ALL").execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(value)
        }
        Err(error) => {
            tx.rollback().await?;
            Err(error)
        }
    }
}

/// A connection taken from the engine's pool: put back on drop when marked
/// healthy, dropped otherwise (including when the future using it was
/// dropped mid-statement, leaving the protocol in an unknown state).
struct Checkout<'p> {
    pool: &'p EnginePool,
    conn: Option<PgConnection>,
    keep: bool,
    _slot: tokio::sync::SemaphorePermit<'p>,
}

impl Checkout<'_> {
    fn conn(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("checked out until dropped")
    }
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.keep
        {
            self.pool.idle().push(conn);
        }
        // Otherwise the connection is dropped here: its socket closes
        // without waiting for the peer.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(pooled: bool) -> SessionLimits {
        SessionLimits {
            statement_timeout: Duration::from_secs(5),
            keepalive: Duration::from_secs(10),
            pooled,
        }
    }

    /// A peer on a loopback port that speaks just enough of the protocol
    /// for sessions to open and answer `ping` (a Sync, answered with
    /// ReadyForQuery), and that can end every session it holds at once,
    /// as a restarted server does.
    struct RestartingServer {
        port: u16,
        sessions: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    }

    impl RestartingServer {
        async fn start() -> Self {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let sessions = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let held = std::sync::Arc::clone(&sessions);
            tokio::spawn(async move {
                while let Ok((mut socket, _)) = listener.accept().await {
                    let session = tokio::spawn(async move {
                        // The startup message: its length, then the rest.
                        let len = socket.read_u32().await.unwrap() as usize;
                        let mut rest = vec![0; len - 4];
                        socket.read_exact(&mut rest).await.unwrap();
                        // AuthenticationOk, BackendKeyData, ReadyForQuery.
                        let hello: &[u8] = &[
                            b'R', 0, 0, 0, 8, 0, 0, 0, 0, b'K', 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0,
                            2, b'Z', 0, 0, 0, 5, b'I',
                        ];
                        socket.write_all(hello).await.unwrap();
                        loop {
                            let Ok(kind) = socket.read_u8().await else {
                                return;
                            };
                            let Ok(len) = socket.read_u32().await else {
                                return;
                            };
                            let mut body = vec![0; len as usize - 4];
                            if socket.read_exact(&mut body).await.is_err() {
                                return;
                            }
                            if kind == b'S'
                                && socket.write_all(&[b'Z', 0, 0, 0, 5, b'I']).await.is_err()
                            {
                                return;
                            }
                        }
                    });
                    held.lock().unwrap().push(session);
                }
            });
            Self { port, sessions }
        }

        /// Ends every session open now (their sockets close).
        fn restart(&self) {
            for session in self.sessions.lock().unwrap().drain(..) {
                session.abort();
            }
        }
    }

    #[tokio::test]
    async fn a_session_found_lost_takes_the_idle_ones_with_it() {
        let server = RestartingServer::start().await;
        let url = format!("postgres://u@127.0.0.1:{}/db?sslmode=disable", server.port);
        let application = PgPool::connect_lazy(&url).unwrap();
        let pool = EnginePool::new(&application, "w", limits(false), 3);
        let deadline = Duration::from_secs(60);
        // Three calls at once open three sessions, which go back idle.
        let together = std::sync::Arc::new(tokio::sync::Barrier::new(3));
        let ping = |together: std::sync::Arc<tokio::sync::Barrier>| {
            let pool = &pool;
            async move {
                call(pool, deadline, "ping", async |conn| {
                    conn.ping().await?;
                    together.wait().await;
                    Ok(())
                })
                .await
            }
        };
        let (a, b, c) = tokio::join!(
            ping(together.clone()),
            ping(together.clone()),
            ping(together.clone())
        );
        a.and(b).and(c).unwrap();
        assert_eq!(pool.idle().len(), 3);

        server.restart();
        let lost = call(&pool, deadline, "ping", async |conn| conn.ping().await).await;
        let error = lost.expect_err("the server ended the session");
        assert!(is_session_lost(&error), "{error}");
        // The other two went with it, rather than failing the next two
        // calls one at a time.
        assert_eq!(pool.idle().len(), 0);
        call(&pool, deadline, "ping", async |conn| conn.ping().await)
            .await
            .expect("a new session");
        assert_eq!(pool.idle().len(), 1);
    }

    #[tokio::test]
    async fn behind_a_pooler_the_limits_open_each_transaction_and_more_settings_join_them() {
        assert_eq!(limits(false).begin(), None);
        let application = PgPool::connect_lazy("postgres://u@localhost/db").unwrap();
        let pool = EnginePool::new(&application, "w", limits(true), 1)
            .with_settings(&[("enable_seqscan", "off")]);
        assert_eq!(
            pool.begin.as_deref(),
            Some(
                "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = '5000'; \
                 SET LOCAL idle_in_transaction_session_timeout = '12000'; \
                 SET LOCAL enable_seqscan = 'off'; DEALLOCATE ALL"
            )
        );
        // No startup options: the pooler refuses them.
        assert_eq!(pool.options().get_options(), None);
        let direct = EnginePool::new(&application, "w", limits(false), 1);
        assert!(
            direct
                .options()
                .get_options()
                .is_some_and(|o| o.contains("statement_timeout=5000"))
        );
    }
}
