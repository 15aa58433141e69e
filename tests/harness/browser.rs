//! A real browser for the dashboard's tests: Debian's `chromium`, headless,
//! driven through `chromedriver` over WebDriver, and the dashboard served
//! in-process on a loopback port.
//!
//! Every test gets its own chromedriver and browser profile. A test that
//! panics leaves a screenshot of the page it was on in
//! `target/browser-screenshots/<test>.png`.

use std::future::Future;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use outbox_worker::dashboard::{self, DashboardConfig};
use outbox_worker::local_broker::free_port;
use sqlx::PgPool;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// Where Debian puts the browser and its driver.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A chromedriver process, killed on drop.
struct Driver {
    child: Child,
    url: String,
    profile: PathBuf,
}

impl Driver {
    async fn start() -> Self {
        let binary = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| CHROMEDRIVER.to_owned());
        assert!(
            std::path::Path::new(&binary).exists(),
            "{binary} is missing: the dashboard's browser tests need Debian's chromium and \
             chromium-driver (bash .ci/install-browser installs them)"
        );
        let port = free_port();
        let child = Command::new(&binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        let url = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "chromedriver did not listen on port {port} within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile =
            std::env::temp_dir().join(format!("outbox-browser-{}-{port}", std::process::id()));
        Self {
            child,
            url,
            profile,
        }
    }

    async fn client(&self) -> Client {
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| CHROMIUM.to_owned());
        // As root Chromium needs --no-sandbox; the background-networking
        // flags keep it from calling home on a machine with no network.
        let capabilities = serde_json::json!({
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--window-size=1400,1000",
                    format!("--user-data-dir={}", self.profile.display()),
                ]
            }
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            unreachable!("a JSON object literal")
        };
        let mut builder = ClientBuilder::new(HttpConnector::new());
        builder.capabilities(capabilities);
        builder
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("cannot start a chromium session: {e}"))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Runs `body` with a fresh browser; on a panic, saves a screenshot named
/// after `test` before passing the panic on.
pub async fn with_browser<F, Fut>(test: &str, body: F)
where
    F: FnOnce(Client) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let driver = Driver::start().await;
    let client = driver.client().await;
    let outcome = tokio::spawn(body(client.clone())).await;
    if outcome.is_err() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/browser-screenshots");
        let path = dir.join(format!("{test}.png"));
        match client.screenshot().await {
            Ok(png) => {
                let _ = std::fs::create_dir_all(&dir);
                match std::fs::write(&path, png) {
                    Ok(()) => eprintln!("screenshot of the failing page: {}", path.display()),
                    Err(e) => eprintln!("cannot save the screenshot {}: {e}", path.display()),
                }
            }
            Err(e) => eprintln!("cannot take a screenshot: {e}"),
        }
        if let Ok(url) = client.current_url().await {
            eprintln!("the browser was on {url}");
        }
    }
    let _ = client.close().await;
    drop(driver);
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// A dashboard served on a loopback port until dropped.
pub struct ServedDashboard {
    /// Its root URL, without a trailing slash.
    pub url: String,
    stop: CancellationToken,
}

impl ServedDashboard {
    /// Serves the dashboard on `pool` with `config`.
    pub async fn start(pool: PgPool, config: DashboardConfig) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let stop = CancellationToken::new();
        tokio::spawn(dashboard::serve(listener, pool, config, stop.clone()));
        Self { url, stop }
    }
}

impl Drop for ServedDashboard {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Signs in on the login page `client` was sent to, with `token`.
pub async fn sign_in(client: &Client, base_url: &str, token: &str) {
    client.goto(base_url).await.expect("open the dashboard");
    let url = client.current_url().await.expect("current url");
    assert!(
        url.path().ends_with("/login"),
        "an anonymous visit goes to the login page, not {url}"
    );
    client
        .find(Locator::Id("token"))
        .await
        .expect("the token field")
        .send_keys(token)
        .await
        .expect("type the token");
    navigate_by_click(client, Locator::Id("sign-in")).await;
}

/// The text of the element with this id.
pub async fn text_of(client: &Client, id: &str) -> String {
    client
        .find(Locator::Id(id))
        .await
        .unwrap_or_else(|e| panic!("no element #{id}: {e}"))
        .text()
        .await
        .expect("its text")
}

/// Clicks the element with this id, which loads a new page, and waits for
/// that page.
pub async fn click(client: &Client, id: &str) {
    navigate_by_click(client, Locator::Id(id)).await;
}

/// Clicks what `target` finds (a link or a submit button) and waits until
/// the browser has left the current page and loaded the next: WebDriver's
/// click returns before a form's navigation completes, and looking for the
/// next page's elements before then would search the old page.
pub async fn navigate_by_click(client: &Client, target: Locator<'_>) {
    let old = client.find(Locator::Css("html")).await.expect("a page");
    client
        .find(target)
        .await
        .unwrap_or_else(|e| panic!("no element {target:?}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("cannot click {target:?}: {e}"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    // The old page's root goes stale once the new page replaced it.
    while old.tag_name().await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "clicking {target:?} loaded no new page"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("body"))
        .await
        .expect("the next page");
}
