//! A throwaway PgBouncer in transaction mode in front of the test server:
//! Debian's `pgbouncer`, on a free loopback port, lending each client a
//! server session one transaction at a time from a deliberately small pool,
//! so that anything an engine session keeps between transactions breaks.
//! Skipped on a developer's machine without it; a failure in CI.

use std::io::Write;

use outbox_worker::local_broker::{BrokerProcess, free_port};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// A running PgBouncer.
pub struct Pgbouncer {
    process: BrokerProcess,
    config: std::path::PathBuf,
}

impl Pgbouncer {
    /// Starts one in front of the test server, lending at most
    /// `server_sessions` server sessions per database, or None (skip) when
    /// pgbouncer is not installed.
    pub async fn start(server_sessions: u32) -> Option<Self> {
        Self::start_in_front_of(
            &crate::server_options(),
            crate::server_password(),
            server_sessions,
        )
        .await
    }

    /// [`Pgbouncer::start`] in front of another server (a test's private
    /// cluster).
    pub async fn start_in_front_of(
        server: &PgConnectOptions,
        password: Option<String>,
        server_sessions: u32,
    ) -> Option<Self> {
        let binary = crate::brokers::find_binary("pgbouncer", &["/usr/sbin/pgbouncer"])?;
        let port = free_port();
        // Any database name is passed through to the same server.
        let mut target = format!(
            "host={} port={} user={}",
            server
                .get_socket()
                .map(|s| s.display().to_string())
                .unwrap_or_else(|| server.get_host().to_owned()),
            server.get_port(),
            server.get_username(),
        );
        if let Some(password) = password {
            target.push_str(&format!(" password={password}"));
        }
        let config = std::env::temp_dir().join(format!(
            "outbox-pgbouncer-{}-{port}.ini",
            std::process::id()
        ));
        let mut file = std::fs::File::create(&config).expect("write pgbouncer.ini");
        write!(
            file,
            "[databases]\n\
             * = {target}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = any\n\
             pool_mode = transaction\n\
             default_pool_size = {server_sessions}\n\
             max_client_conn = 1000\n\
             max_db_connections = {server_sessions}\n\
             server_lifetime = 3600\n\
             query_wait_timeout = 120\n\
             server_login_retry = 1\n\
             log_connections = 0\n\
             log_disconnections = 0\n"
        )
        .expect("write pgbouncer.ini");
        drop(file);
        let process = BrokerProcess::start_with_env(
            "pgbouncer",
            &binary,
            &[&config.display().to_string()],
            &[],
            port,
        )
        .await;
        Some(Self { process, config })
    }

    /// `database_url` (a test database's URL) with its host and port
    /// replaced by the pooler's.
    pub fn url(&self, database_url: &str) -> String {
        let options: PgConnectOptions = database_url.parse().expect("a valid URL");
        format!(
            "postgres://{}@127.0.0.1:{}/{}",
            options.get_username(),
            self.process.port,
            options.get_database().unwrap_or("postgres")
        )
    }

    /// A pool of `max_connections` on `database_url`'s database through
    /// the pooler, set up as an application behind one sets its pool up
    /// (`outbox::pooler::session_options`, and marked).
    pub async fn pool(&self, database_url: &str, max_connections: u32) -> PgPool {
        let options: PgConnectOptions = self.url(database_url).parse().expect("a valid URL");
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(outbox::pooler::session_options(options))
            .await
            .expect("connect through pgbouncer");
        outbox::pooler::mark(&pool);
        pool
    }

    /// Kills the pooler (SIGKILL) and starts it again on the same port.
    pub async fn restart(&mut self) {
        self.process.restart().await;
    }

    /// What the pooler logged.
    pub fn log(&self) -> String {
        self.process.log()
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}
