//! Who may see the dashboard, and which requests may change something.
//!
//! A browser signs in once (a bearer token typed into the login page, or
//! basic auth that the browser sends by itself) and then carries a session
//! cookie. Every state-changing form carries a CSRF token that must equal
//! the `outbox_csrf` cookie (the double-submit pattern: another site can
//! make the browser send the cookie, but cannot read it to put it in the
//! form), and a request whose `Origin` is another site is refused outright.
//! Both cookies are `HttpOnly` and `SameSite=Strict`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Form;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine;
use serde::Deserialize;

use super::Dashboard;
use super::views::{self, LoginPage, Refusal};

/// How the dashboard authenticates.
#[derive(Clone)]
#[non_exhaustive]
pub enum Auth {
    /// A bearer token: API clients send `Authorization: Bearer <token>`,
    /// browsers type it into the login page once per session.
    Token(String),
    /// HTTP basic auth, asked for by the browser.
    Basic {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
    /// No authentication: only for a dashboard on a loopback address, and
    /// only when asked for explicitly (`--insecure-no-auth`).
    None,
}

impl fmt::Debug for Auth {
    // Secrets never reach a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::Token(_) => f.write_str("Token(..)"),
            Auth::Basic { user, .. } => write!(f, "Basic {{ user: {user:?}, .. }}"),
            Auth::None => f.write_str("None"),
        }
    }
}

const SESSION_COOKIE: &str = "outbox_session";
const CSRF_COOKIE: &str = "outbox_csrf";
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// How a request was authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Identity {
    /// A browser (session cookie, basic auth, or the insecure mode): its
    /// state changes need the CSRF token.
    Browser,
    /// A client that sent the bearer token itself; browsers never add that
    /// header on their own, so no CSRF token is needed.
    BearerClient,
}

/// The CSRF token of this browser, for the forms a page renders.
#[derive(Clone, Debug)]
pub(crate) struct CsrfToken(pub(crate) Arc<str>);

/// Signed-in browser sessions, by random id, with their expiry.
#[derive(Default)]
pub(crate) struct Sessions(Mutex<HashMap<String, Instant>>);

impl Sessions {
    fn create(&self) -> String {
        let id = random_token();
        let now = Instant::now();
        let mut sessions = self.0.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|_, expires| *expires > now);
        sessions.insert(id.clone(), now + SESSION_TTL);
        id
    }

    fn valid(&self, id: &str) -> bool {
        let sessions = self.0.lock().unwrap_or_else(|e| e.into_inner());
        sessions
            .get(id)
            .is_some_and(|expires| *expires > Instant::now())
    }

    fn end(&self, id: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

/// 32 random bytes, hex-encoded.
pub(crate) fn random_token() -> String {
    let mut bytes = [0u8; 32];
    // The operating system's generator failing is not something to serve
    // pages through.
    getrandom::fill(&mut bytes).expect("the operating system's random generator");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares secrets in time independent of where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The credentials after `scheme` (matched case-insensitively, as HTTP
/// auth schemes are) in an Authorization header.
fn credentials<'a>(authorization: &'a str, scheme: &str) -> Option<&'a str> {
    let (given, rest) = authorization.trim().split_once(' ')?;
    given.eq_ignore_ascii_case(scheme).then(|| rest.trim())
}

/// Whether `host` (a Host header) names this machine's loopback interface.
fn loopback_host(host: &str) -> bool {
    let name = if let Some(v6) = host.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn identify(d: &Dashboard, headers: &HeaderMap) -> Option<Identity> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match &d.config.auth {
        // Without authentication, only pages asked for by a loopback name:
        // a web page that rebinds its own domain to 127.0.0.1 sends its own
        // name as Host, and must not reach the dashboard.
        Auth::None => headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .is_some_and(loopback_host)
            .then_some(Identity::Browser),
        Auth::Token(token) => {
            if let Some(given) = authorization.and_then(|a| credentials(a, "Bearer")) {
                return same_secret(given.as_bytes(), token.as_bytes())
                    .then_some(Identity::BearerClient);
            }
            cookie(headers, SESSION_COOKIE)
                .filter(|id| d.sessions.valid(id))
                .map(|_| Identity::Browser)
        }
        Auth::Basic { user, password } => {
            let encoded = credentials(authorization?, "Basic")?;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .ok()?;
            let split = decoded.iter().position(|b| *b == b':')?;
            let (u, p) = (&decoded[..split], &decoded[split + 1..]);
            // Both compared, whatever the first says.
            let ok = same_secret(u, user.as_bytes()) & same_secret(p, password.as_bytes());
            ok.then_some(Identity::Browser)
        }
    }
}

/// Middleware on every protected route: lets authenticated requests
/// through (recording how), sends others to sign in.
pub(crate) async fn require(
    State(d): State<Arc<Dashboard>>,
    mut request: Request,
    next: Next,
) -> Response {
    if let Some(identity) = identify(&d, request.headers()) {
        request.extensions_mut().insert(identity);
        return next.run(request).await;
    }
    let bearer_sent = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| credentials(a, "Bearer").is_some());
    match &d.config.auth {
        Auth::None => views::error(
            StatusCode::MISDIRECTED_REQUEST,
            "refused: without authentication the dashboard answers only to localhost or a loopback address in the Host header",
            &d.config,
        ),
        // A script with a wrong token gets a 401, not the login page.
        Auth::Token(_) if bearer_sent => (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                "Bearer realm=\"outbox dashboard\"",
            )],
            "wrong bearer token\n",
        )
            .into_response(),
        Auth::Basic { .. } => (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                "Basic realm=\"outbox dashboard\", charset=\"UTF-8\"",
            )],
            "sign in to see the outbox dashboard\n",
        )
            .into_response(),
        _ if request.method() == Method::GET => {
            Redirect::to(&format!("{}/login", d.config.base_path)).into_response()
        }
        _ => views::error(StatusCode::UNAUTHORIZED, "not signed in", &d.config),
    }
}

/// Middleware on every route: gives the browser a CSRF cookie if it has
/// none, and sets the security headers. The pages' content security policy
/// allows no script at all, so even markup that escaped escaping could not
/// run.
pub(crate) async fn headers(mut request: Request, next: Next) -> Response {
    let existing = cookie(request.headers(), CSRF_COOKIE)
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(Arc::<str>::from);
    let fresh = existing.is_none();
    let token = existing.unwrap_or_else(|| Arc::from(random_token()));
    request
        .extensions_mut()
        .insert(CsrfToken(Arc::clone(&token)));
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    if fresh
        && let Ok(v) = HeaderValue::from_str(&format!(
            "{CSRF_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
        ))
    {
        h.append(header::SET_COOKIE, v);
    }
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Refuses a state change that lacks this browser's CSRF token or comes
/// from another site's page. Bearer-token clients are exempt.
pub(crate) fn check_csrf(
    identity: Identity,
    headers: &HeaderMap,
    form_token: &str,
) -> Result<(), Refusal> {
    if identity == Identity::BearerClient {
        return Ok(());
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        // Behind a reverse proxy that rewrites Host, the name the browser
        // used is in X-Forwarded-Host.
        let hosts = [header::HOST.as_str(), "x-forwarded-host"].map(|name| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(',').next())
                .map(str::trim)
                .unwrap_or("")
        });
        let same_site = origin.split_once("://").is_some_and(|(_, rest)| {
            hosts
                .iter()
                .any(|h| !h.is_empty() && h.eq_ignore_ascii_case(rest))
        });
        if !same_site {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "refused: this request came from another site's page",
            ));
        }
    }
    let expected = cookie(headers, CSRF_COOKIE).unwrap_or("");
    if expected.is_empty() || !same_secret(form_token.as_bytes(), expected.as_bytes()) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "refused: the form's CSRF token is missing or wrong; reload the page and try again",
        ));
    }
    Ok(())
}

/// The sign-in page (token mode only).
pub(crate) async fn login_page(
    State(d): State<Arc<Dashboard>>,
    axum::Extension(csrf): axum::Extension<CsrfToken>,
) -> Response {
    if !matches!(d.config.auth, Auth::Token(_)) {
        return Redirect::to(&d.config.home()).into_response();
    }
    views::render(
        StatusCode::OK,
        &LoginPage {
            base: &d.config.base_path,
            csrf: &csrf.0,
            wrong: false,
        },
    )
}

/// The sign-in form.
#[derive(Deserialize)]
pub(crate) struct LoginForm {
    token: String,
    #[serde(default)]
    csrf: String,
}

/// Checks the typed token and starts a session.
pub(crate) async fn login(
    State(d): State<Arc<Dashboard>>,
    axum::Extension(csrf): axum::Extension<CsrfToken>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let Auth::Token(token) = &d.config.auth else {
        return Redirect::to(&d.config.home()).into_response();
    };
    if let Err(refused) = check_csrf(Identity::Browser, &headers, &form.csrf) {
        return refused.page(&d.config);
    }
    if !same_secret(form.token.trim().as_bytes(), token.as_bytes()) {
        tracing::warn!("dashboard sign-in with a wrong token");
        return views::render(
            StatusCode::UNAUTHORIZED,
            &LoginPage {
                base: &d.config.base_path,
                csrf: &csrf.0,
                wrong: true,
            },
        );
    }
    let id = d.sessions.create();
    let mut response = Redirect::to(&d.config.home()).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_TTL.as_secs()
    )) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
}

/// The sign-out form.
#[derive(Deserialize)]
pub(crate) struct LogoutForm {
    #[serde(default)]
    csrf: String,
}

/// Ends the browser's session.
pub(crate) async fn logout(
    State(d): State<Arc<Dashboard>>,
    axum::Extension(identity): axum::Extension<Identity>,
    headers: HeaderMap,
    Form(form): Form<LogoutForm>,
) -> Response {
    if let Err(refused) = check_csrf(identity, &headers, &form.csrf) {
        return refused.page(&d.config);
    }
    if let Some(id) = cookie(&headers, SESSION_COOKIE) {
        d.sessions.end(id);
    }
    let mut response = Redirect::to(&format!("{}/login", d.config.base_path)).into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        HeaderValue::from_static("outbox_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }

    #[test]
    fn only_loopback_hosts_count_as_loopback() {
        for ok in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "LOCALHOST",
        ] {
            assert!(loopback_host(ok), "{ok}");
        }
        for bad in [
            "attacker.example:8080",
            "10.0.0.1",
            "",
            "[2001:db8::1]:80",
            "localhost.evil",
        ] {
            assert!(!loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn auth_schemes_match_in_any_case() {
        assert_eq!(credentials("bearer abc", "Bearer"), Some("abc"));
        assert_eq!(credentials("Basic  xyz ", "Basic"), Some("xyz"));
        assert_eq!(credentials("Bearer abc", "Basic"), None);
    }

    #[test]
    fn cookies_are_found_among_several() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; outbox_csrf=xyz; b=2"),
        );
        assert_eq!(cookie(&h, "outbox_csrf"), Some("xyz"));
        assert_eq!(cookie(&h, "missing"), None);
    }

    #[test]
    fn the_debug_form_hides_secrets() {
        let shown = format!(
            "{:?} {:?}",
            Auth::Token("s3cret-token".into()),
            Auth::Basic {
                user: "ops".into(),
                password: "s3cret-password".into()
            }
        );
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
