//! A private, throwaway PostgreSQL cluster started from the machine's
//! installed binaries: what `demo`, `bench` and the test suite use when no
//! DATABASE_URL is given.
//!
//! PostgreSQL refuses to run as root, so when this process is root the
//! cluster is initialised and run as the unprivileged `postgres` system user
//! (through `runuser`); an ordinary user runs it as themself.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Why a private cluster could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalPostgresError {
    /// No `initdb` was found.
    #[error(
        "no PostgreSQL server binaries found (looked for initdb in $OUTBOX_PG_BIN, $PATH, \
         `pg_config --bindir` and /usr/lib/postgresql/*/bin): install PostgreSQL \
         (Debian: apt-get install postgresql) or set DATABASE_URL"
    )]
    BinariesNotFound,
    /// Running as root without a `postgres` user to run the server as.
    #[error(
        "running as root, and PostgreSQL refuses to run as root: create an unprivileged \
         `postgres` user (installing the Debian postgresql package does) or run as a normal user"
    )]
    NoUnprivilegedUser,
    /// A command failed.
    #[error("{what} failed: {detail}")]
    Command {
        /// Which step.
        what: String,
        /// Its output or error.
        detail: String,
    },
    /// A file system operation failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Settings for a private cluster.
#[derive(Debug, Clone)]
pub struct LocalPostgresOptions {
    /// Keep fsync and full-page writes on (benchmarks that must be
    /// comparable); off is faster for tests and demos.
    pub durable: bool,
    /// The server's max_connections.
    pub max_connections: u32,
    /// More `name = value` lines for postgresql.conf (e.g. to preload
    /// pg_stat_statements for a benchmark).
    pub extra_settings: Vec<String>,
}

impl Default for LocalPostgresOptions {
    fn default() -> Self {
        Self {
            durable: false,
            max_connections: 200,
            extra_settings: Vec::new(),
        }
    }
}

/// A running private cluster. Dropping it stops the server and removes its
/// directory.
#[derive(Debug)]
pub struct LocalPostgres {
    root: PathBuf,
    bin: PathBuf,
    run_as: Option<String>,
    port: u16,
    stopped: bool,
}

impl LocalPostgres {
    /// Creates a cluster in a new temporary directory and starts it.
    pub fn start(options: &LocalPostgresOptions) -> Result<Self, LocalPostgresError> {
        let bin = server_bin_dir().ok_or(LocalPostgresError::BinariesNotFound)?;
        let run_as = if is_root() {
            if !user_exists("postgres") {
                return Err(LocalPostgresError::NoUnprivilegedUser);
            }
            Some("postgres".to_owned())
        } else {
            None
        };
        let root = new_root()?;
        let mut cluster = Self {
            root,
            bin,
            run_as,
            port: 0,
            stopped: true,
        };
        if let Some(user) = &cluster.run_as {
            run(
                "chown",
                Command::new("chown")
                    .arg(format!("{user}:"))
                    .arg(&cluster.root),
            )?;
        }
        let data = cluster.data_dir();
        run(
            "initdb",
            cluster.pg_command("initdb").arg("-D").arg(&data).args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]),
        )?;
        let mut conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nmax_connections = {}\n",
            cluster.root.display(),
            options.max_connections
        );
        if !options.durable {
            conf.push_str("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n");
        }
        for line in &options.extra_settings {
            conf.push_str(line);
            conf.push('\n');
        }
        append(&data.join("postgresql.conf"), &conf)?;
        // A port that was free a moment ago can be taken by the time the
        // server binds it; try a few.
        let mut last_error = None;
        for _ in 0..5 {
            cluster.port = free_port()?;
            match cluster.pg_ctl_start() {
                Ok(()) => {
                    cluster.stopped = false;
                    return Ok(cluster);
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| LocalPostgresError::Command {
            what: "pg_ctl start".to_owned(),
            detail: "no attempt made".to_owned(),
        }))
    }

    /// `url` when given, else the URL of a new private cluster (returned
    /// too: keep it alive while you use the URL). What the demo, the
    /// benchmark and the examples do with DATABASE_URL.
    pub fn url_or_start(
        url: Option<String>,
        options: &LocalPostgresOptions,
    ) -> Result<(String, Option<Self>), LocalPostgresError> {
        match url.filter(|u| !u.is_empty()) {
            Some(url) => Ok((url, None)),
            None => {
                let cluster = Self::start(options)?;
                Ok((cluster.url("postgres"), Some(cluster)))
            }
        }
    }

    /// The connection URL of database `database` (`postgres` always exists).
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Restarts the server (fast shutdown, then start): every connection is
    /// dropped, as in a real database restart.
    pub fn restart(&self) -> Result<(), LocalPostgresError> {
        run(
            "pg_ctl restart",
            self.pg_command("pg_ctl")
                .arg("-D")
                .arg(self.data_dir())
                .args(["-m", "fast", "-w", "-t", "60", "-l"])
                .arg(self.root.join("server.log"))
                .arg("-o")
                .arg(format!("-p {}", self.port))
                .arg("restart"),
        )
    }

    /// Stops the server (fast shutdown: sessions are terminated) and keeps
    /// its data; [`LocalPostgres::start_again`] brings it back on the same
    /// port. For tests of a database that goes away.
    pub fn stop_server(&self) -> Result<(), LocalPostgresError> {
        run(
            "pg_ctl stop",
            self.pg_command("pg_ctl")
                .arg("-D")
                .arg(self.data_dir())
                .args(["-m", "fast", "-w", "-t", "60", "stop"]),
        )
    }

    /// Starts a server stopped by [`LocalPostgres::stop_server`].
    pub fn start_again(&self) -> Result<(), LocalPostgresError> {
        self.pg_ctl_start()
    }

    /// Stops the server and removes its directory.
    pub fn stop(&mut self) {
        if !self.stopped {
            let _ = run(
                "pg_ctl stop",
                self.pg_command("pg_ctl")
                    .arg("-D")
                    .arg(self.data_dir())
                    .args(["-m", "immediate", "-w", "stop"]),
            );
            self.stopped = true;
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }

    /// Leaves the server running after this process (the demo's `--keep`)
    /// and returns the shell command that stops it and removes its files.
    pub fn keep(mut self) -> String {
        let stop = self.stop_command("fast");
        let root = shell_quote(&self.root.display().to_string());
        self.disown();
        // `;`: the files go even when the server was already down.
        format!("{stop}; rm -rf {root}")
    }

    /// Leaves the server and its directory to someone else: nothing is
    /// done on drop any more.
    fn disown(&mut self) {
        self.stopped = true;
        self.root = PathBuf::new();
    }

    /// `pg_ctl stop` of this server in `mode`, as one shell command.
    fn stop_command(&self, mode: &str) -> String {
        self.pg_command_line("pg_ctl")
            .into_iter()
            .chain([
                "-D".to_owned(),
                self.data_dir().display().to_string(),
                "-m".to_owned(),
                mode.to_owned(),
                "stop".to_owned(),
            ])
            .map(|a| shell_quote(&a))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Makes sure the server goes away when this process does, even if it
    /// never runs destructors (a test binary, a killed process): a small
    /// shell watchdog polls for this process and then stops the server and
    /// removes its directory. The cluster is then owned by the watchdog.
    pub fn stop_when_process_exits(mut self) {
        let stop = self.stop_command("immediate");
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} >/dev/null 2>&1; rm -rf {root}",
            pid = std::process::id(),
            root = shell_quote(&self.root.display().to_string()),
        );
        let spawned = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        if spawned.is_ok() {
            // The watchdog owns the cluster now.
            self.disown();
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    fn pg_ctl_start(&self) -> Result<(), LocalPostgresError> {
        run(
            "pg_ctl start",
            self.pg_command("pg_ctl")
                .arg("-D")
                .arg(self.data_dir())
                .args(["-w", "-t", "60", "-l"])
                .arg(self.root.join("server.log"))
                .arg("-o")
                .arg(format!("-p {}", self.port))
                .arg("start"),
        )
        .map_err(|e| match e {
            LocalPostgresError::Command { what, detail } => LocalPostgresError::Command {
                what,
                detail: format!(
                    "{detail}\n{}",
                    std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
                ),
            },
            other => other,
        })
    }

    /// The argv that runs `program` from the PostgreSQL bin directory, as
    /// the unprivileged user when needed.
    fn pg_command_line(&self, program: &str) -> Vec<String> {
        let path = self.bin.join(program).display().to_string();
        match &self.run_as {
            Some(user) => vec![
                "runuser".to_owned(),
                "-u".to_owned(),
                user.clone(),
                "--".to_owned(),
                path,
            ],
            None => vec![path],
        }
    }

    fn pg_command(&self, program: &str) -> Command {
        let argv = self.pg_command_line(program);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]).stdin(Stdio::null());
        // pg_ctl's server inherits our working directory; the postgres user
        // may not be allowed into it.
        cmd.current_dir(&self.root);
        cmd
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        if !self.root.as_os_str().is_empty() {
            self.stop();
        }
    }
}

fn run(what: &str, cmd: &mut Command) -> Result<(), LocalPostgresError> {
    let output = cmd.output().map_err(|e| LocalPostgresError::Command {
        what: what.to_owned(),
        detail: e.to_string(),
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(LocalPostgresError::Command {
            what: what.to_owned(),
            detail: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

fn append(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

/// A new, empty directory for a cluster, of this process's: its name has
/// the process id, a count of the clusters this process made and the
/// time, and it is created only if it did not exist. Two clusters started
/// at once by one process (a test's own beside the harness's) once got
/// the same name from a clock read in the same tick, and two initdb runs
/// raced in one directory.
fn new_root() -> std::io::Result<PathBuf> {
    static MADE: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let root =
            std::env::temp_dir().join(format!("outbox-pg-{}-{n}-{nanos:x}", std::process::id()));
        match std::fs::create_dir(&root) {
            Ok(()) => return Ok(root),
            // Left by an earlier process of the same id: take another.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {}
            Err(e) => return Err(e),
        }
    }
}

/// A port free on loopback now, and never one this process handed out
/// before. The port is free only until someone binds it: two servers of
/// one process (a test binary starts many at once) given the same port
/// would have the second one's readiness check answered by the first.
pub(crate) fn free_port() -> std::io::Result<u16> {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(port)
        {
            return Ok(port);
        }
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Whether this process runs as root (then servers run as another user).
pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn user_exists(user: &str) -> bool {
    Command::new("id")
        .arg("-u")
        .arg(user)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The directory holding `initdb`, `pg_ctl` and `postgres` (and, from
/// Debian's packages, `psql`): `$OUTBOX_PG_BIN`, `$PATH`, `pg_config
/// --bindir`, then the newest `/usr/lib/postgresql/*/bin`.
pub fn server_bin_dir() -> Option<PathBuf> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os("OUTBOX_PG_BIN").map(PathBuf::from) {
        return has_initdb(&dir).then_some(dir);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_initdb(&dir) {
                // Resolve a symlinked initdb to its real directory, where
                // the matching postgres binary lives.
                let real = std::fs::canonicalize(dir.join("initdb")).ok();
                return Some(
                    real.and_then(|p| p.parent().map(Path::to_path_buf))
                        .unwrap_or(dir),
                );
            }
        }
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_initdb(&dir) {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_initdb(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Roots made at once by threads of one process are distinct, new and
    /// empty, however coarse the clock.
    #[test]
    fn roots_made_at_once_in_one_process_are_distinct() {
        let made: Vec<PathBuf> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8).map(|_| s.spawn(|| new_root().unwrap())).collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut names: Vec<&PathBuf> = made.iter().collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), made.len(), "{made:?}");
        for root in &made {
            assert_eq!(std::fs::read_dir(root).unwrap().count(), 0);
            std::fs::remove_dir(root).unwrap();
        }
    }
}
