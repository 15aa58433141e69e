//! Worker processes for fault tests: real processes, really killed.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use sqlx::PgPool;

/// A running `outbox-test-worker run` process.
pub struct WorkerProcess {
    child: Child,
    log: PathBuf,
}

impl WorkerProcess {
    /// Starts `binary run --database-url url <args>`; its log goes to a file.
    pub fn spawn(binary: &str, url: &str, args: &[&str]) -> Self {
        Self::spawn_with_env(binary, url, args, &[])
    }

    /// Like [`WorkerProcess::spawn`], with extra environment variables.
    pub fn spawn_with_env(binary: &str, url: &str, args: &[&str], envs: &[(&str, &str)]) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log =
            std::env::temp_dir().join(format!("outbox-test-worker-{}-{n}.log", std::process::id()));
        let file = std::fs::File::create(&log).expect("create the worker log");
        let child = Command::new(binary)
            .arg("run")
            .arg("--database-url")
            .arg(url)
            .args(args)
            .env("OUTBOX_LOG", "info,sqlx=warn")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("start the worker process");
        Self { child, log }
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal by name (`KILL`, `TERM`).
    pub fn signal(&self, name: &str) {
        let status = outbox_worker::local_broker::send_signal(i64::from(self.pid()), name)
            .expect("run kill");
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// Waits for the process to exit (at most `within`).
    pub async fn wait(&mut self, within: Duration) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the worker process") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "worker did not exit:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends SIGTERM and asserts the process exits with code 0 within
    /// `bound`; returns how long it took.
    pub async fn terminate_within(&mut self, bound: Duration) -> Duration {
        let started = std::time::Instant::now();
        self.signal("TERM");
        let status = self.wait(bound + Duration::from_secs(30)).await;
        let took = started.elapsed();
        let log = self.log();
        assert_eq!(status.code(), Some(0), "{log}");
        assert!(
            took <= bound,
            "SIGTERM to exit took {took:?}, over {bound:?}:\n{log}"
        );
        took
    }

    /// Waits until at least `completed` tasks are COMPLETED and `running`
    /// are PROCESSING, then kills the process with SIGKILL; returns how many
    /// tasks were PROCESSING once its sessions had ended (the ones it died
    /// holding).
    pub async fn kill_mid_flight(&mut self, pool: &PgPool, completed: i64, running: i64) -> i64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (done, busy): (i64, i64) = sqlx::query_as(
                "SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = 'processing') \
                 FROM outbox_all_tasks",
            )
            .fetch_one(pool)
            .await
            .expect("count tasks");
            if done >= completed && busy >= running {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never {completed} completed and {running} running:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        self.signal("KILL");
        let status = self.wait(Duration::from_secs(10)).await;
        assert!(!status.success(), "killed, not exited: {status:?}");
        self.sessions_ended(pool).await;
        sqlx::query_scalar("SELECT count(*) FROM outbox_all_tasks WHERE state = 'processing'")
            .fetch_one(pool)
            .await
            .expect("count tasks in flight")
    }

    /// Waits until the (killed) process's database sessions have ended. A
    /// statement it sent just before it died still runs to its end on the
    /// server, and an outcome may commit after the kill: what it died
    /// holding is known once its sessions are gone.
    pub async fn sessions_ended(&self, pool: &PgPool) {
        wait_until(
            pool,
            &format!(
                "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity \
                 WHERE application_name LIKE '{} %:{}:%')",
                outbox::ENGINE_APPLICATION_NAME,
                self.pid()
            ),
            Duration::from_secs(60),
        )
        .await;
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .try_wait()
            .expect("poll the worker process")
            .is_none()
    }

    /// What the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the process has logged `needle` (at most `within`, and
    /// failing at once if it exits); returns the log.
    pub async fn wait_for_log(&mut self, needle: &str, within: std::time::Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(
                tokio::time::Instant::now() < deadline && self.is_running(),
                "never logged {needle:?}:\n{log}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Asserts that the process logged, at exit, that it could not release
    /// exactly these tasks.
    #[track_caller]
    pub fn assert_left_behind(&self, ids: &[outbox::TaskId]) {
        let mut left: Vec<i64> = ids.iter().map(|id| id.0).collect();
        left.sort_unstable();
        let named = format!("task_ids={left:?}");
        let log = self.log();
        assert!(
            log.lines()
                .any(|l| l.contains("could not release unfinished tasks") && l.contains(&named)),
            "the log names the tasks left behind ({named}):\n{log}"
        );
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A server process of an example's end-to-end test (an API, a receiver, a
/// service in another language): started, waited for until it listens, and
/// killed on drop. Its standard error goes to a log, shown if it never
/// listens.
pub struct ServerProcess {
    child: Child,
    log: PathBuf,
}

impl ServerProcess {
    /// Starts `command` and waits (at most a minute) until something
    /// accepts connections on `addr`.
    pub async fn start(mut command: Command, addr: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log =
            std::env::temp_dir().join(format!("outbox-test-server-{}-{n}.log", std::process::id()));
        let program = command.get_program().to_string_lossy().into_owned();
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the server's log"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}"));
        let server = Self { child, log };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{program} did not listen on {addr}:\n{}",
                std::fs::read_to_string(&server.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        server
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Polls `sql` (a query returning one boolean) until it is true, at most
/// `within`. For waiting on another process's effect on the database, where
/// no in-process signal exists.
pub async fn wait_until(pool: &PgPool, sql: &str, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let done: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(pool)
            .await
            .expect("poll query");
        if done {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for: {sql}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Polls `done` (a check of the test's own state: a flag a handler set, a
/// list it wrote) until it is true, at most `within`; `what` names the
/// wait in the failure.
pub async fn wait_for_condition(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
