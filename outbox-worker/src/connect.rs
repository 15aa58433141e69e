//! Connecting the CLI to PostgreSQL, with errors an operator can act on:
//! a refused connection, a port where no PostgreSQL answers, a server that
//! says nothing, bad credentials and a missing database are each told apart
//! within seconds instead of surfacing as a pool timeout.

use std::time::Duration;

use clap::Args;
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use crate::failure::{EXIT_SCHEMA_BEHIND, Failure};
use crate::local_postgres::{LocalPostgres, LocalPostgresOptions};

/// Where the database is: the `--database-url` of every command.
#[derive(Debug, Args)]
pub(crate) struct DbArgs {
    /// PostgreSQL connection URL (required: this flag or DATABASE_URL).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// The URL leads to a connection pooler in transaction mode (PgBouncer's
    /// pool_mode = transaction): every statement runs in a transaction of
    /// its own that leaves nothing behind in the session, and no statement
    /// is cached. With `run`, the task table's vacuum is left to
    /// autovacuum, and queues are polled every --poll-interval unless
    /// --listen-url gives a direct connection to LISTEN on.
    #[arg(long, env = "OUTBOX_POOLER")]
    pub(crate) pooler: bool,
}

impl DbArgs {
    /// The URL given, or an error that names both ways to give it (clap's
    /// own would name only the flag, while the README exports the
    /// variable).
    pub(crate) fn url(&self) -> Result<&str, Failure> {
        self.database_url.as_deref().ok_or_else(|| {
            Failure::config(
                "no database given: set DATABASE_URL or pass --database-url \
                 postgres://USER:PASSWORD@HOST:PORT/DATABASE",
            )
        })
    }
}

/// Connects to `db` (see [`connect`]); with `--pooler`, to a connection
/// pooler in transaction mode: sessions fit for one (`outbox::pooler`), and
/// the pool marked as pooled.
pub(crate) async fn connect_db(db: &DbArgs, max_connections: u32) -> Result<PgPool, Failure> {
    connect_db_logging(db, max_connections, true).await
}

/// [`connect_db`] for an operator command, whose statements sqlx does not
/// log: one that runs long is the command's own failure to report (its
/// `--command-timeout`, exit 3), not a warning quoting its SQL first.
/// (`run` keeps sqlx's logging: its pool is also the handlers'.)
pub(crate) async fn connect_operator(db: &DbArgs, max_connections: u32) -> Result<PgPool, Failure> {
    connect_db_logging(db, max_connections, false).await
}

/// [`connect_operator`], refusing a schema behind this build (exit 4).
pub(crate) async fn connect_operator_migrated(
    db: &DbArgs,
    max_connections: u32,
) -> Result<PgPool, Failure> {
    migrated(connect_operator(db, max_connections).await?).await
}

async fn connect_db_logging(
    db: &DbArgs,
    max_connections: u32,
    log_statements: bool,
) -> Result<PgPool, Failure> {
    let pooled = db.pooler;
    let pool = open(db.url()?, max_connections, |options| {
        let options = if pooled {
            outbox::pooler::session_options(options)
        } else {
            options
        };
        if log_statements {
            options
        } else {
            options.disable_statement_logging()
        }
    })
    .await?;
    if pooled {
        outbox::pooler::mark(&pool);
    }
    Ok(pool)
}

/// A pooled session idle this long is pinged before it is handed out.
const PING_IDLE: Duration = Duration::from_secs(1);

/// How long that ping may take before the session is dropped instead.
const PING_WITHIN: Duration = Duration::from_secs(2);

/// How long the first connection may take before the server is reported
/// unreachable.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens one connection to check the server is there and is PostgreSQL,
/// then returns a pool of up to `max_connections` on it. Exit code 2 for a
/// bad URL, credentials or database name; 3 when nothing usable answers.
pub(crate) async fn connect(url: &str, max_connections: u32) -> Result<PgPool, Failure> {
    connect_limited(url, max_connections, None).await
}

/// [`connect`] without the ping on acquire, for `bench`: its clients
/// stand for an application's, whose round trips are what the figures
/// compare (a ping would add one to every transaction on both sides of a
/// ratio, and flatten it).
pub(crate) async fn connect_bench(url: &str, max_connections: u32) -> Result<PgPool, Failure> {
    open_checked(url, max_connections, false, |options| options).await
}

/// Like [`connect`], with a server-side `statement_timeout` on every
/// session of the pool: a query abandoned by its caller stops on the
/// server too instead of holding a connection.
pub(crate) async fn connect_limited(
    url: &str,
    max_connections: u32,
    statement_timeout: Option<Duration>,
) -> Result<PgPool, Failure> {
    open(url, max_connections, |options| match statement_timeout {
        Some(t) => options.options([("statement_timeout", format!("{}ms", t.as_millis()))]),
        None => options,
    })
    .await
}

/// Parses `url`, adjusts its options with `adjust`, checks one connection
/// and returns a lazy pool.
async fn open(
    url: &str,
    max_connections: u32,
    adjust: impl FnOnce(PgConnectOptions) -> PgConnectOptions,
) -> Result<PgPool, Failure> {
    open_checked(url, max_connections, true, adjust).await
}

/// [`open`], with a ping on acquire or (`ping` false) without.
async fn open_checked(
    url: &str,
    max_connections: u32,
    ping: bool,
    adjust: impl FnOnce(PgConnectOptions) -> PgConnectOptions,
) -> Result<PgPool, Failure> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(Failure::config(
            "the database URL (--database-url or DATABASE_URL) must start with postgres:// or postgresql://",
        ));
    }
    let options: PgConnectOptions = url.parse().map_err(|e| {
        Failure::config(format!(
            "the database URL (--database-url or DATABASE_URL) is not a valid PostgreSQL URL: {e}"
        ))
    })?;
    let options = adjust(options);
    connect_once(&options, UrlOf::Database).await?;
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        // The handlers' pool (`ctx.pool()`) and the dashboard's: after a
        // restart or a failover every idle session in it is gone.
        // Unchecked, each would be handed to a handler whose statement
        // then fails, costing its task an attempt (two stale sessions in a
        // row killed a task of two attempts) though the database is back.
        // So a session idle a second or more is pinged first, within a
        // deadline (a silent one is dropped, not waited on): a restart
        // takes longer than that, and a busy pool's sessions, back within
        // the second, pay nothing. The engine's statements are on its own
        // sessions (outbox-core's EnginePool).
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            Box::pin(async move {
                if !ping || meta.idle_for < PING_IDLE {
                    return Ok(true);
                }
                let alive = tokio::time::timeout(PING_WITHIN, conn.ping()).await;
                Ok(matches!(alive, Ok(Ok(()))))
            })
        })
        .connect_lazy_with(options))
}

/// What a connection goes to: a Unix socket (`host=/dir` in the URL) wins
/// over the host name.
fn target_of(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(dir) => format!(
            "the socket in {} (port {})",
            dir.display(),
            options.get_port()
        ),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// Tries `run --listen-url` once before the worker starts: a URL that
/// leads to the pooler, or that PostgreSQL refuses (credentials, database
/// name), is refused (exit 2), where the listener would log it as an
/// outage for ever and the worker would only poll. A server that does not
/// answer now is a warning: the listener keeps trying.
pub(crate) async fn check_listen_url(options: &PgConnectOptions) -> Result<(), Failure> {
    let Err(failure) = connect_once(options, UrlOf::Listen).await else {
        return Ok(());
    };
    if failure.code == crate::failure::EXIT_CONFIG {
        return Err(Failure::config(format!(
            "--listen-url: {}",
            failure.message
        )));
    }
    tracing::warn!(
        "--listen-url: {}; the worker starts, polling until the listener connects",
        failure.message
    );
    Ok(())
}

/// Connects once with `options` within [`CONNECT_TIMEOUT`] and closes the
/// session: what is wrong with the URL, said before anything relies on it.
async fn connect_once(options: &PgConnectOptions, url: UrlOf) -> Result<(), Failure> {
    let target = target_of(options);
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(options)).await {
        Err(_) => Err(Failure::unreachable(format!(
            "no answer from {target} within {CONNECT_TIMEOUT:?}: is PostgreSQL (and not \
             another kind of server) listening there, and is no firewall dropping the \
             connection?"
        ))),
        Ok(Err(e)) => Err(connect_failure(&target, &e, url)),
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
    }
}

/// Which URL a connection was made with, for what its failure says.
#[derive(Clone, Copy)]
enum UrlOf {
    /// The commands' database: `--database-url` or `DATABASE_URL`.
    Database,
    /// `run --listen-url`, a direct connection to LISTEN on.
    Listen,
}

impl UrlOf {
    /// Where the URL comes from.
    fn flag(self) -> &'static str {
        match self {
            UrlOf::Database => "--database-url or DATABASE_URL",
            UrlOf::Listen => "--listen-url",
        }
    }

    /// What to do when it leads to a connection pooler.
    fn at_a_pooler(self) -> &'static str {
        match self {
            UrlOf::Database => {
                "pass --pooler (or set OUTBOX_POOLER=1), or give the URL of PostgreSQL itself"
            }
            UrlOf::Listen => {
                "LISTEN needs a session of its own, so give --listen-url the URL of PostgreSQL \
                 itself"
            }
        }
    }
}

/// What to tell the operator about a first connection that failed.
fn connect_failure(target: &str, e: &sqlx::Error, url: UrlOf) -> Failure {
    use std::io::ErrorKind;
    let url_flag = url.flag();
    match e {
        sqlx::Error::Io(io) if io.kind() == ErrorKind::ConnectionRefused => Failure::unreachable(
            format!("connection refused by {target}: is PostgreSQL running and listening there?"),
        ),
        sqlx::Error::Io(io)
            if matches!(
                io.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::InvalidData
            ) =>
        {
            Failure::unreachable(format!(
                "{target} closed the connection during the PostgreSQL handshake ({io}): \
                 is this a PostgreSQL server, and does it accept this client?"
            ))
        }
        sqlx::Error::Protocol(detail) => Failure::unreachable(format!(
            "{target} does not speak the PostgreSQL protocol ({detail}): check the host and port"
        )),
        // PgBouncer's refusals (SQLSTATE 08P01, which would read as an
        // outage): a session that sends what a pooler in transaction mode
        // does not take, and a database the pooler has no entry for.
        sqlx::Error::Database(db) if db.message().starts_with("unsupported startup parameter") => {
            Failure::config(format!(
                "{target} refused the connection: {}. It looks like a connection pooler \
                 (PgBouncer): {}",
                db.message(),
                url.at_a_pooler()
            ))
        }
        sqlx::Error::Database(db) if db.message().starts_with("no such database") => {
            Failure::config(format!(
                "the connection pooler at {target} refused the connection: {} (check the \
                 database name in {url_flag}, and the pooler's [databases])",
                db.message()
            ))
        }
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            if code.starts_with("28") || code == "3D000" {
                // The message alone: the error's Display adds the server's
                // source line, which means nothing to an operator.
                Failure::config(format!(
                    "PostgreSQL at {target} refused the connection: {} (check {url_flag})",
                    db.message()
                ))
            } else {
                Failure::unreachable(format!(
                    "PostgreSQL at {target} refused the connection: {}",
                    db.message()
                ))
            }
        }
        sqlx::Error::Configuration(_) => {
            Failure::config(format!("the URL ({url_flag}) is not usable: {e}"))
        }
        e if is_unreachable(e) => Failure::unreachable(format!("cannot reach {target}: {e}")),
        e => Failure::runtime(format!("cannot connect to {target}: {e}")),
    }
}

/// Errors that mean the database is not there (rather than that it refused
/// a statement).
pub(crate) fn is_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
    }
}

/// `url`, or else the URL of a new private PostgreSQL (kept alive by the
/// returned handle): what `demo` and `bench` do without DATABASE_URL.
pub(crate) async fn database_or_private(
    url: Option<String>,
    options: LocalPostgresOptions,
) -> Result<(String, Option<LocalPostgres>), Failure> {
    tokio::task::spawn_blocking(move || LocalPostgres::url_or_start(url, &options))
        .await
        .map_err(Failure::runtime)?
        .map_err(|e| Failure::runtime(format!("cannot start a private PostgreSQL: {e}")))
}

/// Connects and refuses to go on when the schema is behind this build.
pub(crate) async fn connect_migrated(db: &DbArgs, max_connections: u32) -> Result<PgPool, Failure> {
    migrated(connect_db(db, max_connections).await?).await
}

/// `pool` if its schema is up to date; exit code 4 otherwise.
pub(crate) async fn migrated(pool: PgPool) -> Result<PgPool, Failure> {
    let status = outbox::schema_status(&pool).await?;
    if !status.is_up_to_date() {
        return Err(Failure {
            code: EXIT_SCHEMA_BEHIND,
            message: format!(
                "the database schema is at version {} but this build needs {}: \
                 run `{} migrate` first",
                status.current,
                status.latest,
                this_command()
            ),
        });
    }
    Ok(pool)
}

/// How the operator reaches this binary again: through `cargo run` when
/// cargo started it from a build of its own (cargo names the package in the
/// environment; the README's demo command, or an application's own binary
/// built on `main_with`, with `--bin` for a package that may have several),
/// else as it was invoked.
pub(crate) fn this_command() -> String {
    let exe = std::env::current_exe().ok();
    let built = exe
        .as_ref()
        .is_some_and(|e| e.components().any(|c| c.as_os_str() == "target"));
    let bin = exe
        .as_ref()
        .and_then(|e| e.file_stem())
        .map(|s| s.to_string_lossy().into_owned());
    match (std::env::var("CARGO_PKG_NAME"), bin) {
        (Ok(package), Some(bin)) if built && !package.is_empty() => {
            if package == "outbox-worker" && bin == "outbox-worker" {
                // This package's one binary.
                "cargo run -p outbox-worker --".to_owned()
            } else {
                format!("cargo run -p {package} --bin {bin} --")
            }
        }
        _ => std::env::args()
            .next()
            .filter(|arg0| !arg0.is_empty())
            .unwrap_or_else(|| "outbox-worker".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session of the pool ended by the server (as a restart or a
    /// failover ends them all) is not handed out: the next statement gets
    /// a fresh one and succeeds, instead of failing a handler's attempt.
    #[tokio::test]
    async fn a_session_the_server_ended_is_not_handed_to_the_next_statement() {
        let db = outbox_tests::TestDb::migrated().await;
        let pool = connect(&db.url, 1).await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .unwrap();
        let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 60000)")
            .bind(pid)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert!(ended);
        // Sessions idle a second or more are checked (a restart takes
        // longer): this one has been, when the next statement comes.
        tokio::time::sleep(PING_IDLE + Duration::from_millis(200)).await;
        let again: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .expect("a fresh session, not the ended one");
        assert_ne!(again, pid);
    }
}
