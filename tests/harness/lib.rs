//! The test harness: one PostgreSQL server per test process, one fresh
//! database per test, so tests run in parallel without seeing each other.
//!
//! With DATABASE_URL set, databases are created on that server (the role
//! needs CREATEDB). Without it, a private cluster is started from the
//! installed PostgreSQL binaries and stopped when the test process exits.

pub mod brokers;
pub mod browser;
pub mod pooler;
pub mod process;
pub mod proxy;
pub mod sinks;
pub mod tasks;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outbox::{TaskEvent, TaskEventKind, Worker};
use outbox_worker::local_postgres::{LocalPostgres, LocalPostgresOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The server every test database lives on.
fn server_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            let cluster = LocalPostgres::start(&LocalPostgresOptions {
                durable: false,
                max_connections: 500,
                // The events tests read the order transactions committed
                // in (pg_xact_commit_timestamp).
                extra_settings: vec!["track_commit_timestamp = on".to_owned()],
            })
            .unwrap_or_else(|e| panic!("cannot start a private PostgreSQL for the tests: {e}"));
            let url = cluster.url("postgres");
            cluster.stop_when_process_exits();
            url
        }
    })
}

/// The test server's connection options (its `postgres` database).
pub fn server_options() -> PgConnectOptions {
    server_url()
        .parse::<PgConnectOptions>()
        .expect("DATABASE_URL is a valid PostgreSQL URL")
}

/// The password in the test server's URL, if it has one.
pub fn server_password() -> Option<String> {
    let url = server_url();
    let rest = url.split_once("://")?.1;
    let userinfo = rest.split_once('@')?.0;
    userinfo.split_once(':').map(|(_, p)| p.to_owned())
}

fn options_for(database: &str) -> PgConnectOptions {
    server_url()
        .parse::<PgConnectOptions>()
        .expect("DATABASE_URL is a valid PostgreSQL URL")
        .database(database)
}

/// A migrated template database; test databases are copies of it.
async fn template() -> &'static str {
    static TEMPLATE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    TEMPLATE
        .get_or_init(|| async {
            let name = format!("outbox_template_{}", std::process::id());
            create_database(&name, None).await;
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .connect_with(options_for(&name))
                .await
                .unwrap();
            outbox::migrate(&pool)
                .await
                .expect("migrate the template database");
            pool.close().await;
            name
        })
        .await
}

async fn create_database(name: &str, template: Option<&str>) {
    let admin = server_url()
        .parse::<PgConnectOptions>()
        .expect("valid DATABASE_URL");
    let mut conn = PgConnection::connect_with(&admin)
        .await
        .expect("connect to the test server");
    let sql = match template {
        Some(t) => format!("CREATE DATABASE \"{name}\" TEMPLATE \"{t}\""),
        None => format!("CREATE DATABASE \"{name}\""),
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("create test database {name}: {e}"));
    let _ = conn.close().await;
}

/// A database of one's own for one test.
pub struct TestDb {
    /// A pool on it.
    pub pool: PgPool,
    /// Its URL, for a second pool or a child process.
    pub url: String,
}

impl TestDb {
    /// A fresh database with the outbox schema applied.
    pub async fn migrated() -> Self {
        let template = template().await;
        Self::create(Some(template)).await
    }

    /// A fresh, empty database.
    pub async fn empty() -> Self {
        Self::create(None).await
    }

    async fn create(template: Option<&str>) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "outbox_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        create_database(&name, template).await;
        let options = options_for(&name);
        let url = options.to_url_lossy().to_string();
        Self {
            pool: Self::pool_on(&url, 10).await,
            url,
        }
    }

    /// A database migrated to version 42, so that migration 43 (which
    /// alters `outbox_tasks`) is pending, and an open transaction that has
    /// read `outbox_tasks`: what holds a migration's table lock up.
    pub async fn held_before_migration_43() -> (Self, sqlx::Transaction<'static, sqlx::Postgres>) {
        let db = Self::empty().await;
        outbox::migrate_to(&db.pool, 42)
            .await
            .expect("migrate to 42");
        let mut holder = db.pool.begin().await.expect("begin the holder");
        sqlx::query("SELECT count(*) FROM outbox_tasks")
            .execute(&mut *holder)
            .await
            .expect("read outbox_tasks");
        (db, holder)
    }

    /// A login role with every right on this database's tables, sequences
    /// and functions but those on `table`, and a pool of its sessions: for
    /// a test of what a worker does when it may not read one table. Drop it
    /// with [`RoleWithout::drop_role`] at the test's end.
    pub async fn role_without(&self, table: &str) -> RoleWithout {
        let name = format!(
            "outbox_no_{table}_{}",
            self.url
                .rsplit('/')
                .next()
                .unwrap()
                .split('?')
                .next()
                .unwrap()
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE ROLE {name} LOGIN;
             GRANT ALL ON ALL TABLES IN SCHEMA public TO {name};
             GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {name};
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {name};
             REVOKE ALL ON {table} FROM {name};"
        )))
        .execute(&self.pool)
        .await
        .expect("create the role");
        let options: sqlx::postgres::PgConnectOptions = self.url.parse().expect("the test URL");
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.username(&name))
            .await
            .expect("connect as the role");
        RoleWithout {
            pool,
            name,
            owner: self.pool.clone(),
        }
    }

    /// Another, separate pool on this database (a second "machine").
    pub async fn pool_on(url: &str, max_connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await
            .expect("connect to the test database")
    }

    /// A connection from the pool, for `outbox::submit(&mut *db.conn().await, ..)`.
    pub async fn conn(&self) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
        self.pool
            .acquire()
            .await
            .expect("a connection from the test pool")
    }

    /// Moves the tasks of the intake (where a single submit of a task due
    /// now writes it) into `outbox_tasks`, as a claim would: for a test
    /// that changes a submitted task's row there by hand.
    pub async fn take_intake(&self) {
        sqlx::query("SELECT outbox_take_intake(1000000, 0, NULL)")
            .execute(&self.pool)
            .await
            .expect("move the intake");
    }

    /// Number of task rows.
    pub async fn task_count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks")
            .fetch_one(&self.pool)
            .await
            .expect("count tasks")
    }

    /// Number of tasks in each state, as `(state, count)` sorted by state.
    pub async fn count_by_state(&self) -> Vec<(String, i64)> {
        sqlx::query_as("SELECT state::text, count(*) FROM outbox_all_tasks GROUP BY 1 ORDER BY 1")
            .fetch_all(&self.pool)
            .await
            .expect("count tasks by state")
    }
}

/// A role made by [`TestDb::role_without`], with a pool of its sessions.
pub struct RoleWithout {
    /// Sessions of the role.
    pub pool: PgPool,
    name: String,
    owner: PgPool,
}

impl RoleWithout {
    /// Closes the role's sessions and drops the role (roles belong to the
    /// whole cluster, which other tests share).
    pub async fn drop_role(self) {
        self.pool.close().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP OWNED BY {0}; DROP ROLE {0};",
            self.name
        )))
        .execute(&self.owner)
        .await
        .expect("drop the role");
    }
}

/// A worker running in the background of a test.
pub struct RunningWorker {
    /// Committed outcomes, subscribed before the worker started.
    pub events: broadcast::Receiver<TaskEvent>,
    shutdown: CancellationToken,
    handle: JoinHandle<outbox::Result<()>>,
}

impl RunningWorker {
    /// Starts `worker`.
    pub fn start(worker: Worker) -> Self {
        let events = worker.subscribe();
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(worker.run(shutdown.clone()));
        Self {
            events,
            shutdown,
            handle,
        }
    }

    /// Waits (at most `within`) until `n` outcomes of `kind` were committed,
    /// and returns the events seen on the way.
    pub async fn wait_for(
        &mut self,
        kind: TaskEventKind,
        n: usize,
        within: Duration,
    ) -> Vec<TaskEvent> {
        wait_for(&mut self.events, kind, n, within).await
    }

    /// Waits (at most `within`) until every `(kind, n)` count was reached,
    /// in any order, and returns the events seen on the way.
    pub async fn wait_for_all(
        &mut self,
        counts: &[(TaskEventKind, usize)],
        within: Duration,
    ) -> Vec<TaskEvent> {
        let deadline = tokio::time::Instant::now() + within;
        let mut seen: Vec<TaskEvent> = Vec::new();
        for (kind, n) in counts {
            let have = seen.iter().filter(|e| e.kind == *kind).count();
            if have < *n {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                seen.extend(wait_for(&mut self.events, *kind, n - have, left).await);
            }
        }
        seen
    }

    /// Asks the worker to stop (no new claims from now on) without waiting;
    /// [`Self::stop`] then waits for it.
    pub fn request_stop(&self) {
        self.shutdown.cancel();
    }

    /// Stops the worker gracefully and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.handle.await.expect("worker task").expect("worker run");
    }
}

/// Waits (at most `within`) until `n` outcomes of `kind` arrive on
/// `events`, and returns every event seen on the way.
pub async fn wait_for(
    events: &mut broadcast::Receiver<TaskEvent>,
    kind: TaskEventKind,
    n: usize,
    within: Duration,
) -> Vec<TaskEvent> {
    let mut seen = Vec::new();
    let mut matched = 0;
    let deadline = tokio::time::Instant::now() + within;
    while matched < n {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(event)) => {
                if event.kind == kind {
                    matched += 1;
                }
                seen.push(event);
            }
            Ok(Err(broadcast::error::RecvError::Lagged(missed))) => {
                panic!("test fell behind the worker's events by {missed}")
            }
            Ok(Err(broadcast::error::RecvError::Closed)) => panic!("worker stopped early"),
            Err(_) => {
                panic!("timed out after {within:?}: {matched} of {n} {kind:?} events; saw {seen:?}")
            }
        }
    }
    seen
}
