//! The admin page in a real browser: headless Chromium driven by chromedriver through the W3C
//! WebDriver protocol (plain HTTP and JSON, no client library). The page is opened behind HTTP
//! Basic authentication with the credentials in its address (`http://user:pass@host/admin/`),
//! as an operator may; it lists a held claim, an operator clicks "Mark done" or "Release" and
//! accepts the confirmation, and the next delivery through the layer is a duplicate, or runs.
//! A claim whose owner still renews it is shown as running, its buttons disabled; the ages
//! on the page tick; a line counts the claims. With the inbox, a dead entry is listed with its
//! last error and its stored request; "Retry now" and the confirmation make the workers run it.
//!
//! Needs `chromium` and `chromedriver` (Debian: `apt-get install chromium chromium-driver`).
//! Without them the tests are skipped, loudly, or fail when `CI` is set.

mod common;

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request as AxumRequest;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response as AxumResponse};
use axum::routing::post;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_idempotency::admin::Admin;
use tower_idempotency::body::BoxError;
use tower_idempotency::inbox::{Backoff, Inbox};
use tower_idempotency::store::inbox::{EntryState, InboxStore};
use tower_idempotency::store::{Claim, MemoryStore, Store};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Stale, key};

use common::{PAST_SHORT, SHORT, counting_layer_service, delivery, key_in, unique_namespace};

/// The W3C name of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long the browser may take for one step (starting it, above all) on a busy machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// The first of `names` found on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// chromedriver and the browser, or `None` (after saying so) when this machine has none;
/// under `CI`, their absence fails the test.
fn browser_tools() -> Option<(PathBuf, PathBuf)> {
    let driver = on_path(&["chromedriver"]);
    let browser = on_path(&["chromium", "chromium-browser", "google-chrome"]);
    if let (Some(driver), Some(browser)) = (&driver, &browser) {
        return Some((driver.clone(), browser.clone()));
    }
    let missing = match (driver, browser) {
        (None, None) => "chromedriver and chromium",
        (None, _) => "chromedriver",
        _ => "chromium",
    };
    if std::env::var_os("CI").is_some() {
        panic!("{missing} not found on PATH; CI is set, so this fails instead of skipping");
    }
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {missing} not found on PATH (Debian: apt-get install chromium chromium-driver)"
    );
    None
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A running chromedriver and, once opened, its browser session. Dropping it ends the
/// session (the browser quits) and kills chromedriver, also when the test fails half way.
struct Driver {
    child: Child,
    port: u16,
    session: Option<String>,
}

impl Driver {
    async fn start(driver: &PathBuf) -> Self {
        let port = free_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let driver = Self {
            child,
            port,
            session: None,
        };
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok((_, status)) = driver.try_call(Method::GET, "/status", None).await
                && status["value"]["ready"] == true
            {
                return driver;
            }
            assert!(Instant::now() < deadline, "chromedriver did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One WebDriver command: an HTTP/1 request with a JSON body, its status and JSON answer.
    async fn try_call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value), Box<dyn std::error::Error + Send + Sync>> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let body = body.map(|body| body.to_string()).unwrap_or_default();
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("127.0.0.1:{}", self.port))
            .header("content-type", "application/json; charset=utf-8")
            .body(Full::new(Bytes::from(body)))?;
        let res = sender.send_request(req).await?;
        let status = res.status();
        let bytes = res.into_body().collect().await?.to_bytes();
        Ok((status, serde_json::from_slice(&bytes)?))
    }

    /// A command in the session that must succeed: its `value`.
    async fn command(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let session = self.session.as_deref().expect("a session");
        let full = format!("/session/{session}{path}");
        let (status, answer) = self
            .try_call(method, &full, body)
            .await
            .unwrap_or_else(|err| panic!("{full}: {err}"));
        assert_eq!(status, StatusCode::OK, "{full}: {answer}");
        answer["value"].clone()
    }

    /// Opens a headless browser session.
    async fn open(&mut self, browser: &PathBuf) {
        let capabilities = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": browser,
                        "args": ["--headless=new", "--no-sandbox", "--disable-gpu"],
                    },
                },
            },
        });
        let (status, answer) = self
            .try_call(Method::POST, "/session", Some(capabilities))
            .await
            .expect("ask chromedriver for a session");
        assert_eq!(status, StatusCode::OK, "new session: {answer}");
        let session = answer["value"]["sessionId"].as_str().expect("a session id");
        self.session = Some(session.to_owned());
        let timeouts = json!({ "script": 30_000, "pageLoad": 60_000, "implicit": 0 });
        self.command(Method::POST, "/timeouts", Some(timeouts))
            .await;
    }

    async fn navigate(&self, url: &str) {
        self.command(Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// Waits until `xpath` finds an element; answers its reference.
    async fn wait_for(&self, xpath: &str) -> String {
        let session = self.session.as_deref().expect("a session");
        let path = format!("/session/{session}/element");
        let query = json!({ "using": "xpath", "value": xpath });
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (status, answer) = self
                .try_call(Method::POST, &path, Some(query.clone()))
                .await
                .expect("find an element");
            if status == StatusCode::OK {
                return answer["value"][ELEMENT]
                    .as_str()
                    .expect("an element reference")
                    .to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "no element {xpath} on the page: {answer}\n{}",
                self.page_text().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How many elements `xpath` finds now.
    async fn count(&self, xpath: &str) -> usize {
        let query = json!({ "using": "xpath", "value": xpath });
        let found = self.command(Method::POST, "/elements", Some(query)).await;
        found.as_array().map_or(0, Vec::len)
    }

    /// The text of `element` now.
    async fn text(&self, element: &str) -> String {
        let path = format!("/element/{element}/text");
        let text = self.command(Method::GET, &path, None).await;
        text.as_str().unwrap_or_default().to_owned()
    }

    /// The computed value of the CSS `property` of `element`.
    async fn css(&self, element: &str, property: &str) -> String {
        let path = format!("/element/{element}/css/{property}");
        let value = self.command(Method::GET, &path, None).await;
        value.as_str().unwrap_or_default().to_owned()
    }

    async fn click(&self, element: &str) {
        let path = format!("/element/{element}/click");
        self.command(Method::POST, &path, Some(json!({}))).await;
    }

    /// Waits for the confirmation the click opened, checks that it names `key`, accepts it.
    async fn accept_confirmation(&self, key: &str) {
        let session = self.session.as_deref().expect("a session");
        let path = format!("/session/{session}/alert/text");
        let deadline = Instant::now() + PATIENCE;
        let text = loop {
            let (status, answer) = self
                .try_call(Method::GET, &path, None)
                .await
                .expect("ask for the alert");
            if status == StatusCode::OK {
                break answer["value"].as_str().unwrap_or_default().to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "no confirmation opened: {answer}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            text.contains(key),
            "the confirmation names the key: {text:?}"
        );
        self.command(Method::POST, "/alert/accept", Some(json!({})))
            .await;
    }

    /// The text of the whole page, for failure messages.
    async fn page_text(&self) -> String {
        let script = json!({ "script": "return document.body.innerText", "args": [] });
        let session = self.session.as_deref().unwrap_or_default();
        match self
            .try_call(
                Method::POST,
                &format!("/session/{session}/execute/sync"),
                Some(script),
            )
            .await
        {
            Ok((_, answer)) => answer["value"].to_string(),
            Err(err) => format!("(no page text: {err})"),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Blocking on purpose: a drop cannot wait for a future, and the browser must quit
        // even when the test panics.
        if let Some(session) = self.session.take() {
            let _ = delete_session(self.port, &session);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `DELETE /session/{id}` over a plain blocking socket: the browser quits.
fn delete_session(port: u16, session: &str) -> std::io::Result<()> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(
        stream,
        "DELETE /session/{session} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    Ok(())
}

/// A key that would run script if the page inserted it as HTML.
const HOSTILE: &str = "<img src=x onerror=alert(1)>";

/// The layer's stale policy: hold claims not renewed for `SHORT`.
const HOLD: Stale = Stale::hold_after(SHORT);

/// The operator's credentials, as the page's address carries them (`user:pass@`).
const CREDENTIALS: &str = "user:pass";

/// `Basic` and the base64 of [`CREDENTIALS`].
const BASIC: &str = "Basic dXNlcjpwYXNz";

/// The application's HTTP Basic authentication: 401 with a challenge (the browser then sends
/// the credentials of the address) unless the request carries them. Counts the requests for
/// the list of claims that it lets through.
async fn basic_auth(listed: Arc<AtomicUsize>, req: AxumRequest, next: Next) -> AxumResponse {
    match req.headers().get(http::header::AUTHORIZATION) {
        Some(value) if value == BASIC => {
            if req.uri().path().ends_with("/claims") {
                listed.fetch_add(1, Ordering::SeqCst);
            }
            next.run(req).await
        }
        _ => (
            StatusCode::UNAUTHORIZED,
            [(http::header::WWW_AUTHENTICATE, "Basic realm=\"admin\"")],
        )
            .into_response(),
    }
}

/// Serves `admin` at `/admin` on a loopback port, behind HTTP Basic authentication; answers
/// the port and the count of list requests.
async fn serve_admin(admin: Admin<MemoryStore>) -> (u16, Arc<AtomicUsize>) {
    let listed = Arc::new(AtomicUsize::new(0));
    let counter = listed.clone();
    let app = Router::new()
        .nest_service("/admin", admin.router())
        .layer(middleware::from_fn(move |req, next| {
            basic_auth(counter.clone(), req, next)
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, listed)
}

/// The page's address with the credentials in it.
fn address(port: u16, path: &str) -> String {
    format!("http://{CREDENTIALS}@127.0.0.1:{port}{path}")
}

/// A claim on `id` in `ns`, as the layer stores it without a router, whose owner died at once.
async fn held_claim(store: &MemoryStore, ns: &str, id: &str) -> IdempotencyKey {
    let key = key_in(ns, id);
    let Claim::Acquired(lease) = store.claim(&key, HOLD).await.unwrap() else {
        panic!("claim {key}")
    };
    drop(lease);
    tokio::time::sleep(PAST_SHORT).await;
    key
}

/// The next delivery of `id` through the layer: its outcome header, and whether it ran.
async fn deliver(store: &MemoryStore, ns: &str, id: &str) -> (String, bool) {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store.clone())
        .key(key::header("x-event-id").namespace(ns.to_owned()))
        .stale(HOLD);
    let res = counting_layer_service(layer, runs.clone())
        .oneshot(delivery(id))
        .await
        .unwrap();
    let outcome = res
        .headers()
        .get("idempotency-outcome")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (outcome, runs.load(Ordering::SeqCst) == 1)
}

/// Opens the page at `path`, waits for the held claim `id`, clicks `button` on its row,
/// accepts the confirmation, and waits for the page to say `said`.
async fn resolve_in_the_browser(
    path: &str,
    button: &str,
    said: &str,
) -> Option<(MemoryStore, String)> {
    let (driver_path, browser) = browser_tools()?;
    let store = MemoryStore::new();
    let ns = unique_namespace("browser");
    let id = "evt_browser";
    let key = held_claim(&store, &ns, id).await;
    held_claim(&store, &ns, HOSTILE).await;
    let (outcome, ran) = deliver(&store, &ns, id).await;
    assert_eq!((outcome.as_str(), ran), ("held", false), "held before");

    let admin = Admin::new(store.clone()).stuck_after(SHORT).stale(HOLD);
    let (port, _) = serve_admin(admin).await;
    let mut driver = Driver::start(&driver_path).await;
    driver.open(&browser).await;
    driver.navigate(&address(port, path)).await;

    let row = format!("//tr[td[normalize-space()='{id}']]");
    driver
        .wait_for(&format!(
            "{row}/td[normalize-space()='{}']",
            key.namespace()
        ))
        .await;
    let runs = driver.wait_for(&format!("{row}/td[6]")).await;
    assert_eq!(driver.text(&runs).await, "1", "the runs column");
    driver
        .wait_for(&format!(
            "{row}/td[7][starts-with(normalize-space(), 'Held')]"
        ))
        .await;
    driver
        .wait_for("//p[@id='claims-count'][contains(., '2 of 2 claims listed: 2 held.')]")
        .await;
    // Shown as text: no element was made of it, no script ran.
    driver
        .wait_for(&format!("//td[normalize-space()='{HOSTILE}']"))
        .await;
    assert_eq!(driver.count("//table[@id='claims']//img").await, 0);

    let clicked = driver
        .wait_for(&format!("{row}//button[normalize-space()='{button}']"))
        .await;
    driver.click(&clicked).await;
    driver.accept_confirmation(id).await;
    driver
        .wait_for(&format!(
            "//p[@id='status'][contains(., '{said}')][contains(., '{id}')]"
        ))
        .await;
    // The list was loaded again: the claim is gone from it, the other one is still there.
    driver
        .wait_for(&format!(
            "//table[@id='claims']/tbody[not({row_in})][tr/td[normalize-space()='{HOSTILE}']]",
            row_in = format_args!("tr[td[normalize-space()='{id}']]"),
        ))
        .await;
    drop(driver);
    Some((store, ns))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mark_done_in_the_browser_makes_the_next_delivery_a_duplicate() {
    // At `/admin/`, with the trailing slash.
    let Some((store, ns)) = resolve_in_the_browser("/admin/", "Mark done", "Marked done").await
    else {
        return;
    };
    let (outcome, ran) = deliver(&store, &ns, "evt_browser").await;
    assert_eq!((outcome.as_str(), ran), ("duplicate", false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_in_the_browser_lets_the_next_delivery_run() {
    // At `/admin`, without the trailing slash: the page's requests still reach the router.
    let Some((store, ns)) = resolve_in_the_browser("/admin", "Release", "Released").await else {
        return;
    };
    let (outcome, ran) = deliver(&store, &ns, "evt_browser").await;
    assert_eq!((outcome.as_str(), ran), ("", true));
}

/// A claim whose owner renews it (every 50 ms, under a stale limit of `SHORT`) and one held,
/// on a page opened with credentials in its address: both listed, the running one as running
/// with its buttons disabled until the force box is ticked; the ages tick; a line counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_tells_running_from_held_and_its_ages_tick() {
    let Some((driver_path, browser)) = browser_tools() else {
        return;
    };
    let store = MemoryStore::new();
    let ns = unique_namespace("browser-running");
    let held = held_claim(&store, &ns, "evt_held").await;
    let running = key_in(&ns, "evt_running");
    let Claim::Acquired(lease) = store.claim(&running, HOLD).await.unwrap() else {
        panic!("claim {running}")
    };
    let owner = {
        let store = store.clone();
        tokio::spawn(async move {
            loop {
                store.renew(&lease).await.expect("renew");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // Every claim is listed at once, running or not.
    let admin = Admin::new(store.clone())
        .stuck_after(Duration::ZERO)
        .stale(HOLD);
    let (port, listed) = serve_admin(admin).await;
    let mut driver = Driver::start(&driver_path).await;
    driver.open(&browser).await;
    driver.navigate(&address(port, "/admin/")).await;

    let held_row = "//tr[td[normalize-space()='evt_held']]";
    let running_row = "//tr[td[normalize-space()='evt_running']]";
    let namespace = driver
        .wait_for(&format!(
            "{held_row}/td[normalize-space()='{}']",
            held.namespace()
        ))
        .await;
    assert_eq!(driver.css(&namespace, "white-space").await, "nowrap");
    driver
        .wait_for(&format!(
            "{held_row}/td[7][starts-with(normalize-space(), 'Held')]"
        ))
        .await;
    driver
        .wait_for(&format!(
            "{running_row}/td[7][starts-with(normalize-space(), 'Running')]"
        ))
        .await;
    driver
        .wait_for(
            "//p[@id='claims-count'][contains(., '2 of 2 claims listed: 1 held, 1 running.')]",
        )
        .await;
    // Held: its buttons work. Running: disabled, until the force box is ticked.
    driver
        .wait_for(&format!(
            "{held_row}//button[normalize-space()='Mark done'][not(@disabled)]"
        ))
        .await;
    for button in ["Mark done", "Release"] {
        driver
            .wait_for(&format!(
                "{running_row}//button[normalize-space()='{button}'][@disabled]"
            ))
            .await;
    }
    let force = driver.wait_for("//input[@id='force']").await;
    driver.click(&force).await;
    driver
        .wait_for(&format!(
            "{running_row}//button[normalize-space()='Release'][not(@disabled)]"
        ))
        .await;

    // The age of the held claim moves on while the page keeps the list it has: it ticks.
    let claimed = format!("{held_row}/td[3]");
    let mut ticked = false;
    for _ in 0..5 {
        let before_list = listed.load(Ordering::SeqCst);
        let before = driver.text(&driver.wait_for(&claimed).await).await;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let after = driver.text(&driver.wait_for(&claimed).await).await;
        if listed.load(Ordering::SeqCst) != before_list {
            continue; // the page read the list again meanwhile: try once more
        }
        assert!(before.ends_with(" s ago"), "{before:?}");
        assert_ne!(before, after, "the age froze");
        ticked = true;
        break;
    }
    assert!(ticked, "the page never kept its list for 2.5 s");
    drop(driver);
    owner.abort();
}

/// Waits until the inbox's workers (tasks of their own) brought the entry of `key` to `state`.
async fn until_state(store: &MemoryStore, key: &IdempotencyKey, state: EntryState) {
    let deadline = Instant::now() + PATIENCE;
    while store.entry(key).await.unwrap().map(|entry| entry.state) != Some(state) {
        assert!(Instant::now() < deadline, "{key} never became {state:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Two deliveries stored by an inbox layer whose workers fail them until they are dead; the
/// page, opened with credentials in its address, lists them with their last error and shows
/// one's stored request; the operator clicks "Retry now" on it and accepts the confirmation,
/// the workers run it, and the page drops it from the list while the other stays dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_entry_is_retried_from_the_page_and_runs() {
    let Some((driver_path, browser)) = browser_tools() else {
        return;
    };
    let store = MemoryStore::new();
    let inbox = Inbox::new(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Router::new().route(
        "/hooks",
        post(move || async move {
            counted.fetch_add(1, Ordering::SeqCst);
            StatusCode::NO_CONTENT
        })
        .layer(
            inbox
                .layer()
                .unverified()
                .key(key::header("x-event-id").namespace("shop")),
        ),
    );
    // The workers' service fails every attempt while `broken`, before the request reaches its
    // route, as an app whose database is down.
    let broken = Arc::new(AtomicBool::new(true));
    let service = {
        let (app, broken) = (app.clone(), broken.clone());
        tower::service_fn(move |req: Request<Full<Bytes>>| {
            let (app, broken) = (app.clone(), broken.clone());
            async move {
                if broken.load(Ordering::SeqCst) {
                    return Err::<AxumResponse, BoxError>("the ledger is unreachable".into());
                }
                app.oneshot(req).await.map_err(BoxError::from)
            }
        })
    };
    let id = "evt_dead";
    for event in [id, HOSTILE] {
        let delivery = Request::post("/hooks")
            .header("x-event-id", event)
            .body(axum::body::Body::from(r#"{"order":42}"#))
            .unwrap();
        let res = app.clone().oneshot(delivery).await.unwrap();
        assert_eq!(res.status(), StatusCode::ACCEPTED, "{event}");
    }
    let key = key_in("shop@/hooks", id);
    let other = key_in("shop@/hooks", HOSTILE);
    let workers = inbox
        .workers(service)
        .backoff(Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(1),
            2,
        ))
        .poll_interval(Duration::from_millis(20))
        .spawn();
    until_state(&store, &key, EntryState::Dead).await;
    until_state(&store, &other, EntryState::Dead).await;
    broken.store(false, Ordering::SeqCst);

    let (port, _) = serve_admin(Admin::new(store.clone()).inbox()).await;
    let mut driver = Driver::start(&driver_path).await;
    driver.open(&browser).await;
    driver.navigate(&address(port, "/admin/")).await;

    let row = format!("//table[@id='inbox']//tr[td[normalize-space()='{id}']]");
    driver
        .wait_for(&format!(
            "{row}/td[3][starts-with(normalize-space(), 'Dead')]"
        ))
        .await;
    let attempts = driver.wait_for(&format!("{row}/td[4]")).await;
    assert_eq!(driver.text(&attempts).await, "2", "the attempts column");
    driver
        .wait_for(&format!(
            "{row}/td[5][normalize-space()='Error: did not reach its inbox route: the app failed: the ledger is unreachable']"
        ))
        .await;
    driver
        .wait_for("//p[@id='inbox-count'][contains(., '2 of 2 entries listed, the oldest first: 2 dead.')]")
        .await;
    driver
        .wait_for("//p[@id='inbox-dead']/button[normalize-space()='Retry all dead of shop@/hooks']")
        .await;
    // The hostile key is text: no element was made of it.
    driver
        .wait_for(&format!(
            "//table[@id='inbox']//td[normalize-space()='{HOSTILE}']"
        ))
        .await;
    assert_eq!(driver.count("//table[@id='inbox']//img").await, 0);

    // Its stored request, as the workers run it.
    let show = driver
        .wait_for(&format!("{row}//button[normalize-space()='Show request']"))
        .await;
    driver.click(&show).await;
    driver
        .wait_for("//pre[@id='request-head'][starts-with(., 'POST /hooks')][contains(., 'x-event-id: evt_dead')]")
        .await;
    driver
        .wait_for("//pre[@id='request-body'][normalize-space()='{\"order\":42}']")
        .await;
    driver
        .wait_for("//p[@id='request-note'][contains(., '12 bytes, as text')]")
        .await;

    let retry = driver
        .wait_for(&format!("{row}//button[normalize-space()='Retry now']"))
        .await;
    driver.click(&retry).await;
    driver.accept_confirmation(id).await;
    driver
        .wait_for(&format!(
            "//p[@id='status'][contains(., 'Retried')][contains(., '{id}')]"
        ))
        .await;
    until_state(&store, &key, EntryState::Done).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the retried entry ran once");
    // The page reads the inbox again: the entry is gone from the list, the other still there.
    driver
        .wait_for(&format!(
            "//table[@id='inbox']/tbody[not(tr[td[normalize-space()='{id}']])][tr/td[normalize-space()='{HOSTILE}']]"
        ))
        .await;
    drop(driver);
    workers.stop().await;
    let entry = store.entry(&other).await.unwrap().expect("an entry");
    assert_eq!(
        entry.state,
        EntryState::Dead,
        "the other entry was not retried"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
