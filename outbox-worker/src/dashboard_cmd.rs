//! `outbox-worker dashboard`: serves the web dashboard until SIGTERM or
//! SIGINT.

use std::net::SocketAddr;

use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::connect::{DbArgs, connect_db, connect_limited, migrated};
use crate::dashboard::{self, Auth, DashboardConfig};
use crate::failure::Failure;

/// The dashboard's flags. Credentials come from the environment only.
#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Address to serve on. Credentials come from OUTBOX_DASHBOARD_TOKEN, or
    /// OUTBOX_DASHBOARD_USER and OUTBOX_DASHBOARD_PASSWORD (16 characters or
    /// more); serve it behind TLS when it leaves the machine.
    #[arg(long, env = "OUTBOX_DASHBOARD_ADDR", default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Show everything, change nothing.
    #[arg(long)]
    read_only: bool,
    /// Serve without authentication: refused unless --addr is a loopback
    /// address. For a dashboard on your own machine only.
    #[arg(long)]
    insecure_no_auth: bool,
    /// Serve the dashboard under this path (for example /outbox), for a
    /// reverse proxy that passes the path through unchanged.
    #[arg(long, default_value = "", value_parser = base_path)]
    base_path: String,
}

fn base_path(s: &str) -> Result<String, String> {
    let ok = s.is_empty()
        || (s.starts_with('/')
            && !s.contains("//")
            && !s
                .split('/')
                .any(|segment| segment == "." || segment == "..")
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c)));
    if ok {
        Ok(s.trim_end_matches('/').to_owned())
    } else {
        Err(format!(
            "{s:?} is not a path prefix: start it with one '/', letters, digits, '-', '_', '.' and '/' only"
        ))
    }
}

pub(crate) async fn run(args: DashboardArgs) -> Result<(), Failure> {
    let config = if args.insecure_no_auth {
        if !args.addr.ip().is_loopback() {
            return Err(Failure::config(format!(
                "--insecure-no-auth serves the dashboard to anyone who can reach {}; it is only allowed on a loopback address (127.0.0.1, ::1)",
                args.addr
            )));
        }
        tracing::warn!("dashboard without authentication (--insecure-no-auth)");
        if std::env::var_os(dashboard::TOKEN_ENV).is_some() || std::env::var_os(dashboard::USER_ENV).is_some() {
            tracing::warn!("dashboard credentials are set in the environment but ignored: --insecure-no-auth asks for none");
        }
        DashboardConfig::new(Auth::None)
    } else {
        DashboardConfig::from_env().map_err(|e| Failure::config(e.to_string()))?
    }
    .read_only(args.read_only)
    .base_path(args.base_path);
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| {
            Failure::config(format!("cannot serve the dashboard on {}: {e}", args.addr))
        })?;
    // The pages' deadline, enforced by the server too: a query a page gave
    // up on must not keep running and hold a connection. (A pooler refuses
    // the startup option that carries it: there the pages' own deadline
    // holds, and the role's statement_timeout on the server.)
    let pool = if args.db.pooler {
        connect_db(&args.db, 8).await?
    } else {
        connect_limited(args.db.url()?, 8, Some(dashboard::QUERY_DEADLINE)).await?
    };
    let pool = migrated(pool).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(crate::stop_on_signal(shutdown.clone()));
    let addr = listener.local_addr().unwrap_or(args.addr);
    tracing::info!(
        %addr,
        auth = ?config.auth,
        read_only = config.read_only,
        "dashboard at http://{addr}{}/",
        config.base_path
    );
    dashboard::serve(listener, pool.clone(), config, shutdown)
        .await
        .map_err(|e| Failure::runtime(format!("the dashboard stopped: {e}")))?;
    pool.close().await;
    Ok(())
}
