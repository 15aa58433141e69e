//! Throwaway brokers (nats-server, redis-server) for the relay tests and
//! `bench --relay`: real servers from the machine's packages, on free
//! loopback ports, each with its own data directory, which can be killed
//! with SIGKILL and restarted on the same port and directory.
//!
//! When root (CI, sessions), a server runs as `nobody` through `setpriv`,
//! which execs it, so the process killed is the server itself.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a broker gets to listen after it is started or restarted.
const START_DEADLINE: Duration = Duration::from_secs(180);

/// Sends `signal` (a name: `KILL`, `TERM`) to the process `target`, or to
/// the process group `-target` when it is negative, through kill(1) (the
/// workspace forbids `unsafe`, so no libc::kill).
///
/// Always `kill -s NAME -- TARGET`: Debian 12's procps-ng 4.0.2 reads
/// `kill -KILL -1234` as `kill(-1, SIGKILL)`, which as root ends every
/// process on the machine. Targets 0 and -1 (this group, everything) are
/// refused for the same reason.
pub fn send_signal(target: i64, signal: &str) -> std::io::Result<std::process::ExitStatus> {
    if target == 0 || target == -1 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("refusing to signal {target}"),
        ));
    }
    Command::new("kill")
        .args(["-s", signal, "--", &target.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
}

/// The first of `candidates` that exists, else `name` on the PATH (Debian
/// puts nats-server in /usr/sbin, which an ordinary user's PATH may lack,
/// and RabbitMQ's own script in /usr/lib/rabbitmq/bin, behind a wrapper on
/// the PATH that insists on switching user).
pub fn find_binary(name: &str, candidates: &[&str]) -> Option<PathBuf> {
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join(name))
                    .find(|p| p.is_file())
            })
        })
}

/// A server process that can be killed and started again as it was.
pub struct BrokerProcess {
    binary: PathBuf,
    args: Vec<String>,
    /// Its data directory (kept across restarts, removed at drop).
    pub dir: PathBuf,
    /// Its loopback port.
    pub port: u16,
    envs: Vec<(String, String)>,
    child: Option<Child>,
    log: PathBuf,
    /// A command run at drop, after the kill (RabbitMQ's epmd daemonizes).
    cleanup: Option<Vec<String>>,
}

/// A broker this module knows how to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// nats-server with JetStream.
    Nats,
    /// redis-server with `appendonly yes`, `appendfsync always`.
    Redis,
    /// rabbitmq-server (its own script, not Debian's wrapper).
    Rabbitmq,
}

impl Kind {
    /// The server binary's name and where Debian puts it.
    pub fn binary(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Kind::Nats => (
                "nats-server",
                &["/usr/sbin/nats-server", "/usr/bin/nats-server"],
            ),
            Kind::Redis => ("redis-server", &["/usr/bin/redis-server"]),
            Kind::Rabbitmq => (
                "rabbitmq-server",
                &["/usr/lib/rabbitmq/bin/rabbitmq-server"],
            ),
        }
    }

    /// Starts one on a free loopback port with a fresh data directory.
    pub async fn start(self, binary: &Path) -> BrokerProcess {
        match self {
            Kind::Nats => {
                BrokerProcess::start(
                    "nats",
                    binary,
                    &["-a", "127.0.0.1", "-p", "{port}", "-js", "-sd", "{dir}"],
                )
                .await
            }
            Kind::Redis => {
                BrokerProcess::start(
                    "redis",
                    binary,
                    &[
                        "--port",
                        "{port}",
                        "--bind",
                        "127.0.0.1",
                        "--dir",
                        "{dir}",
                        "--appendonly",
                        "yes",
                        "--appendfsync",
                        "always",
                        "--save",
                        "",
                        "--protected-mode",
                        "no",
                    ],
                )
                .await
            }
            Kind::Rabbitmq => {
                // A node, ports, cookie and data of its own;
                // RUNNING_UNDER_SYSTEMD makes the script exec the VM (with
                // no shell reading stdin), so the process killed is the
                // broker. Its epmd (a daemon) is stopped at drop.
                let epmd = free_port().to_string();
                let dist = free_port().to_string();
                let mut server = BrokerProcess::prepare(
                    "rabbitmq",
                    binary,
                    &[],
                    &[
                        ("RABBITMQ_NODENAME", "outbox-{port}@localhost"),
                        ("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1"),
                        ("RABBITMQ_NODE_PORT", "{port}"),
                        ("RABBITMQ_DIST_PORT", &dist),
                        ("ERL_EPMD_PORT", &epmd),
                        ("ERL_EPMD_ADDRESS", "127.0.0.1"),
                        ("RABBITMQ_MNESIA_BASE", "{dir}/mnesia"),
                        ("RABBITMQ_LOG_BASE", "{dir}/log"),
                        ("RABBITMQ_CONFIG_FILE", "{dir}/rabbitmq"),
                        ("RABBITMQ_ADVANCED_CONFIG_FILE", "{dir}/advanced.config"),
                        ("RABBITMQ_ENABLED_PLUGINS_FILE", "{dir}/enabled_plugins"),
                        ("RABBITMQ_PID_FILE", "{dir}/rabbitmq.pid"),
                        ("RUNNING_UNDER_SYSTEMD", "true"),
                        // No busy-waiting schedulers: on a small shared
                        // machine they take the cores the database and
                        // the relay need.
                        (
                            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                            "+sbwt none +sbwtdcpu none +sbwtdio none",
                        ),
                        ("HOME", "{dir}"),
                    ],
                    free_port(),
                );
                // Set before the start, so that a start that panics (and
                // drops the server) stops the epmd it launched too.
                server.cleanup = Some(vec!["epmd".into(), "-port".into(), epmd, "-kill".into()]);
                server.spawn().await;
                server
            }
        }
    }

    /// The relay URL of a running one (RabbitMQ as `guest`, whose password
    /// goes in `OUTBOX_RELAY_<NAME>_SECRET`).
    pub fn url(self, server: &BrokerProcess) -> String {
        match self {
            Kind::Nats => format!("nats://127.0.0.1:{}", server.port),
            Kind::Redis => format!("redis://127.0.0.1:{}", server.port),
            Kind::Rabbitmq => format!("amqp://guest@127.0.0.1:{}/%2f", server.port),
        }
    }
}

impl BrokerProcess {
    /// Starts `binary` with `args` (`{port}` and `{dir}` filled in) and waits
    /// until its port accepts connections.
    pub async fn start(name: &str, binary: &Path, args: &[&str]) -> Self {
        Self::start_with_env(name, binary, args, &[], free_port()).await
    }

    /// [`BrokerProcess::start`] with environment variables (`{port}` and
    /// `{dir}` filled in there too) on the given port.
    pub async fn start_with_env(
        name: &str,
        binary: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
        port: u16,
    ) -> Self {
        let mut broker = Self::prepare(name, binary, args, envs, port);
        broker.spawn().await;
        broker
    }

    /// Its directory and command line, not started yet.
    fn prepare(name: &str, binary: &Path, args: &[&str], envs: &[(&str, &str)], port: u16) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("outbox-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the broker's directory");
        let fill = |a: &str| {
            a.replace("{port}", &port.to_string())
                .replace("{dir}", &dir.display().to_string())
        };
        let args = args.iter().map(|a| fill(a)).collect();
        let envs = envs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), fill(v)))
            .collect();
        if crate::local_postgres::is_root() {
            let status = Command::new("chown")
                .args(["-R", "nobody:nogroup"])
                .arg(&dir)
                .status()
                .expect("run chown");
            assert!(status.success(), "chown the broker's directory");
        }
        Self {
            binary: binary.to_owned(),
            args,
            log: dir.with_extension("log"),
            dir,
            port,
            envs,
            child: None,
            cleanup: None,
        }
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the broker's log");
        let mut command = if crate::local_postgres::is_root() {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
                .arg(&self.binary);
            c
        } else {
            Command::new(&self.binary)
        };
        // Its own process group, so a kill reaches whatever it started.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.binary.display()));
        self.child = Some(child);
        // Generous: RabbitMQ restarted after a SIGKILL recovers its message
        // store before it listens, and on a loaded two-core machine that
        // once took more than a minute (the relay scenario's restart, with
        // some 5,000 persistent messages queued).
        let deadline = tokio::time::Instant::now() + START_DEADLINE;
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "{} exited at start ({status}):\n{}",
                    self.binary.display(),
                    self.log()
                );
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} did not listen on {} within {START_DEADLINE:?}:\n{}",
                self.binary.display(),
                self.port,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the server with SIGKILL and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = send_signal(-i64::from(child.id()), "KILL");
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills it (SIGKILL), leaves it down half a second, and starts it
    /// again: same port, same data.
    pub async fn restart(&mut self) {
        self.kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.spawn().await;
    }

    /// Its process id while it runs (for the bench's CPU figures).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        let mut text = std::fs::read_to_string(&self.log).unwrap_or_default();
        // RabbitMQ says little on its console once it has started booting:
        // what it is doing is in the log files of its own log directory.
        let own = std::fs::read_dir(self.dir.join("log"))
            .into_iter()
            .flatten();
        for file in own.flatten() {
            if let Ok(own_text) = std::fs::read_to_string(file.path()) {
                text.push_str(&format!("\n---- {}\n{own_text}", file.path().display()));
            }
        }
        text
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.kill();
        if let Some(cleanup) = &self.cleanup {
            let _ = Command::new(&cleanup[0])
                .args(&cleanup[1..])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A port free on loopback now, never one this process handed out before
/// (to a broker, a private PostgreSQL or anything else).
pub fn free_port() -> u16 {
    crate::local_postgres::free_port().expect("a free loopback port")
}
