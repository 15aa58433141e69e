//! The web dashboard: server-rendered pages over the same operator queries
//! the CLI uses (`outbox::admin`), served by `outbox-worker dashboard` or
//! mounted in an application's own axum app with [`router`].
//!
//! ```no_run
//! # async fn f(pool: outbox::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_worker::dashboard::{self, DashboardConfig};
//! let config = DashboardConfig::from_env()?.base_path("/outbox");
//! let app = axum::Router::new().nest("/outbox", dashboard::router(pool, config));
//! # let _ = app; Ok(()) }
//! ```
//!
//! Security: every page needs authentication unless the dashboard was
//! started in the insecure local mode ([`Auth::None`]); every state-changing
//! request needs the page's CSRF token (a bearer-token client is exempt: a
//! browser never adds that header on its own); everything shown is
//! HTML-escaped by the templates; request text only ever reaches SQL as a
//! bound parameter. [`DashboardConfig::read_only`] hides and refuses every
//! action.

mod auth;
mod events;
mod pages;
mod views;
mod workflows;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use sqlx::PgPool;

pub use auth::Auth;

/// The environment variable holding the bearer token.
pub const TOKEN_ENV: &str = "OUTBOX_DASHBOARD_TOKEN";
/// The environment variable holding the basic-auth user name.
pub const USER_ENV: &str = "OUTBOX_DASHBOARD_USER";
/// The environment variable holding the basic-auth password.
pub const PASSWORD_ENV: &str = "OUTBOX_DASHBOARD_PASSWORD";

/// How long one page may wait for the database before it shows an error.
pub const QUERY_DEADLINE: Duration = Duration::from_secs(10);

/// How the dashboard is protected and where it is mounted.
#[derive(Clone, Debug)]
pub struct DashboardConfig {
    /// Who may see it.
    pub auth: Auth,
    /// Show everything, change nothing: no action buttons, every POST
    /// refused.
    pub read_only: bool,
    /// The path the router is nested under ("" at the root, "/outbox" for
    /// `Router::nest("/outbox", ..)`), for the links it renders.
    pub base_path: String,
}

/// Why a dashboard configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No credentials in the environment and no insecure mode asked for.
    #[error(
        "the dashboard needs credentials: set {TOKEN_ENV} (a bearer token), or {USER_ENV} and {PASSWORD_ENV} (basic auth); or start it without authentication on a loopback address with --insecure-no-auth"
    )]
    NoCredentials,
    /// Half of the basic-auth pair.
    #[error("set both {USER_ENV} and {PASSWORD_ENV}, or neither")]
    HalfBasicAuth,
    /// A token and basic auth at once: which one was meant?
    #[error("set either {TOKEN_ENV} or {USER_ENV} and {PASSWORD_ENV}, not both")]
    Both,
    /// Basic auth cannot carry a user name with a colon.
    #[error(
        "the dashboard's user name ({USER_ENV}) cannot contain ':' (basic auth separates the user from the password with it)"
    )]
    ColonInUser,
    /// A credential too short to resist guessing.
    #[error("{0} must be at least 16 characters")]
    TooShort(&'static str),
}

impl DashboardConfig {
    /// Credentials from the environment: [`TOKEN_ENV`], or [`USER_ENV`] and
    /// [`PASSWORD_ENV`]. Secrets come from the environment or from code
    /// ([`DashboardConfig::token`], [`DashboardConfig::basic`]), never from
    /// flags (which other users of the machine can read).
    pub fn from_env() -> Result<Self, ConfigError> {
        // Surrounding whitespace (a secret file's trailing newline) is not
        // part of the secret: what clients send is trimmed the same way.
        let var = |name| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_owned())
                .filter(|v: &String| !v.is_empty())
        };
        match (var(TOKEN_ENV), var(USER_ENV), var(PASSWORD_ENV)) {
            (Some(token), None, None) => Self::checked_token(token, TOKEN_ENV),
            (None, Some(user), Some(password)) => Self::checked_basic(user, password, PASSWORD_ENV),
            (None, None, None) => Err(ConfigError::NoCredentials),
            (None, _, _) => Err(ConfigError::HalfBasicAuth),
            (Some(_), _, _) => Err(ConfigError::Both),
        }
    }

    /// Bearer-token authentication with a token from the application's own
    /// settings (at least 16 characters; surrounding whitespace is not
    /// part of it), the same check [`DashboardConfig::from_env`] makes.
    pub fn token(token: impl Into<String>) -> Result<Self, ConfigError> {
        Self::checked_token(token.into().trim().to_owned(), "the dashboard token")
    }

    /// Basic authentication with credentials from the application's own
    /// settings (a password of at least 16 characters, a user name without
    /// ':'), checked as [`DashboardConfig::from_env`] checks them.
    pub fn basic(
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        Self::checked_basic(
            user.into().trim().to_owned(),
            password.into().trim().to_owned(),
            "the dashboard password",
        )
    }

    fn checked_token(token: String, what: &'static str) -> Result<Self, ConfigError> {
        if token.chars().count() < 16 {
            return Err(ConfigError::TooShort(what));
        }
        Ok(Self::new(Auth::Token(token)))
    }

    fn checked_basic(
        user: String,
        password: String,
        what: &'static str,
    ) -> Result<Self, ConfigError> {
        if password.chars().count() < 16 {
            return Err(ConfigError::TooShort(what));
        }
        if user.contains(':') {
            return Err(ConfigError::ColonInUser);
        }
        Ok(Self::new(Auth::Basic { user, password }))
    }

    /// A configuration with `auth`, read-write, mounted at the root.
    pub fn new(auth: Auth) -> Self {
        Self {
            auth,
            read_only: false,
            base_path: String::new(),
        }
    }

    /// The overview's path: the base path itself (`Router::nest` serves a
    /// nested `/` there, not at `base/`), or `/` at the root.
    pub(crate) fn home(&self) -> String {
        if self.base_path.is_empty() {
            "/".to_owned()
        } else {
            self.base_path.clone()
        }
    }

    /// Sets read-only mode.
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Sets the path the router is nested under.
    pub fn base_path(mut self, base: impl Into<String>) -> Self {
        self.base_path = base.into().trim_end_matches('/').to_owned();
        self
    }
}

/// What every request handler shares.
pub(crate) struct Dashboard {
    pub(crate) pool: PgPool,
    pub(crate) config: DashboardConfig,
    pub(crate) sessions: auth::Sessions,
}

/// The dashboard's routes, to serve alone or nest in an application's
/// router.
pub fn router(pool: PgPool, config: DashboardConfig) -> Router {
    let state = Arc::new(Dashboard {
        pool,
        config,
        sessions: auth::Sessions::default(),
    });
    let protected = Router::new()
        .route("/", get(pages::overview))
        .route("/tasks", get(pages::tasks))
        .route("/periodic", get(pages::periodic))
        .route("/queues", get(pages::queues))
        .route("/events", get(events::events))
        .route("/workflows", get(workflows::list))
        .route("/workflows/{id}", get(workflows::show))
        .route("/workflows/{id}/cancel", post(workflows::cancel))
        .route(
            "/events/{subscription}/{action}",
            post(events::parked_action),
        )
        .route("/queues/{name}/{action}", post(pages::queue_action))
        .route("/tasks/{id}", get(pages::task))
        .route("/tasks/{id}/retry", post(pages::retry_one))
        .route("/tasks/{id}/cancel", post(pages::cancel_one))
        .route("/tasks/bulk", post(pages::bulk))
        .route("/dead/retry", post(pages::retry_all_dead))
        .route("/logout", post(auth::logout))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            auth::require,
        ));
    Router::new()
        .route("/login", get(auth::login_page).post(auth::login))
        .route("/assets/style.css", get(pages::style))
        .merge(protected)
        .layer(axum::middleware::from_fn(auth::headers))
        .with_state(state)
}

/// Serves the dashboard on `listener` until `shutdown`, under its base
/// path.
pub async fn serve(
    listener: tokio::net::TcpListener,
    pool: PgPool,
    config: DashboardConfig,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    // Served under its base path, so a reverse proxy can pass the path
    // through unchanged; `base/` redirects to `base`.
    let app = if config.base_path.is_empty() {
        router(pool, config)
    } else {
        let base = config.base_path.clone();
        let home = base.clone();
        Router::new()
            .route(
                &format!("{base}/"),
                get(move || async move { axum::response::Redirect::to(&home) }),
            )
            .nest(&base, router(pool, config))
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

#[cfg(test)]
mod tests {
    use super::{Auth, ConfigError, DashboardConfig};

    #[test]
    fn credentials_from_code_are_checked_as_the_environments_are() {
        let config = DashboardConfig::token(" a-token-of-twenty-chars\n").unwrap();
        assert!(matches!(&config.auth, Auth::Token(t) if t == "a-token-of-twenty-chars"));
        assert!(matches!(
            DashboardConfig::token("short"),
            Err(ConfigError::TooShort(_))
        ));
        let config = DashboardConfig::basic("ops", "a-password-of-twenty").unwrap();
        assert!(matches!(
            &config.auth,
            Auth::Basic { user, password } if user == "ops" && password == "a-password-of-twenty"
        ));
        assert!(matches!(
            DashboardConfig::basic("o:ps", "a-password-of-twenty"),
            Err(ConfigError::ColonInUser)
        ));
        assert!(matches!(
            DashboardConfig::basic("ops", "short"),
            Err(ConfigError::TooShort(_))
        ));
    }
}
