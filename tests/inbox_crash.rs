//! Promise: an inbox keeps every acknowledged event through a process killed at the worst
//! moment (DESIGN.md, "Tests that matter" 7).
//!
//! Each test re-runs this test binary as a child process (the `inbox_child` test, switched
//! on by `TOWER_IDEMPOTENCY_INBOX_CHILD`), killed with SIGKILL: no destructor, drop guard or
//! settlement runs in it.
//!
//! - A worker killed mid-handler: while it lives, its heartbeat keeps the entry (the parent's
//!   own workers, running all along, do not take it). Under reclaim the parent's workers run
//!   it once the stale limit has passed since the kill, exactly once, and the crash is
//!   counted; under hold they never do, and the entry is listed as running, unrenewed.
//! - An ingest killed right after its 2xx: the parent's workers (another instance) run the
//!   event, once.
//!
//! On PostgreSQL, MariaDB and a SQLite file.

#![cfg(all(unix, any(feature = "postgres", feature = "sqlite", feature = "mysql")))]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_idempotency::inbox::{Backoff, Inbox};
use tower_idempotency::store::inbox::{EntryState, InboxStore};
use tower_idempotency::{IdempotencyKey, Stale, key};

const CHILD_VAR: &str = "TOWER_IDEMPOTENCY_INBOX_CHILD";
/// `postgres`, `mysql` or `sqlite:<path>`.
const CHILD_DB: &str = "TOWER_IDEMPOTENCY_INBOX_CHILD_DB";
const CHILD_POLICY: &str = "TOWER_IDEMPOTENCY_INBOX_CHILD_POLICY";
/// What the child prints once its handler runs, or (ingest) with its address.
const RUNNING: &str = "TOWER-IDEMPOTENCY-INBOX-CHILD-RUNNING";
const LISTENING: &str = "TOWER-IDEMPOTENCY-INBOX-CHILD-LISTENING";

/// The stale limit, in the child and the parent alike.
const LIMIT: Duration = Duration::from_millis(1500);
/// Each test's table of its own: a worker takes entries of every namespace.
const TABLE_RECLAIM: &str = "inbox_crash_reclaim";
const TABLE_HOLD: &str = "inbox_crash_hold";
const TABLE_INGEST: &str = "inbox_crash_ingest";

fn stale(policy: &str) -> Stale {
    match policy {
        "hold" => Stale::hold_after(LIMIT),
        _ => Stale::reclaim_after(LIMIT),
    }
}

/// The app: one route behind the inbox layer, whose handler `handle` is.
fn app<St: InboxStore + Clone, F, Fut>(inbox: &Inbox<St>, handle: F) -> Router
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = StatusCode> + Send + 'static,
{
    Router::new().route(
        "/hooks",
        post(handle).layer(inbox.layer().unverified().key(key::header("x-event-id"))),
    )
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

// ---------------------------------------------------------------------------------------
// The child
// ---------------------------------------------------------------------------------------

/// The child process. Without `TOWER_IDEMPOTENCY_INBOX_CHILD` it does nothing and passes.
#[test]
fn inbox_child() {
    let Ok(mode) = std::env::var(CHILD_VAR) else {
        return;
    };
    let db = std::env::var(CHILD_DB).expect(CHILD_DB);
    let policy = std::env::var(CHILD_POLICY).expect(CHILD_POLICY);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        // Should the parent die without killing us, do not linger.
        let _ = tokio::time::timeout(Duration::from_secs(120), child(&mode, &db, &policy)).await;
        std::process::exit(3);
    });
}

async fn child(mode: &str, db: &str, policy: &str) {
    let table = match (mode, policy) {
        ("ingest", _) => TABLE_INGEST,
        (_, "hold") => TABLE_HOLD,
        _ => TABLE_RECLAIM,
    };
    match db {
        #[cfg(feature = "postgres")]
        "postgres" => play(mode, policy, postgres(table).await.unwrap()).await,
        #[cfg(feature = "mysql")]
        "mysql" => play(mode, policy, mysql(table).await.unwrap()).await,
        #[cfg(feature = "sqlite")]
        path if path.starts_with("sqlite:") => {
            play(mode, policy, sqlite(&path["sqlite:".len()..], table).await).await
        }
        other => panic!("unknown database {other:?}"),
    }
}

async fn play<St: InboxStore + Clone>(mode: &str, policy: &str, store: St) {
    let inbox = Inbox::new(store);
    match mode {
        // Workers whose handler says it runs, then hangs until the process is killed.
        "work-and-hang" => {
            let app = app(&inbox, || async {
                say(RUNNING);
                std::future::pending::<StatusCode>().await
            });
            let _workers = inbox
                .workers(app)
                .stale(stale(policy))
                .poll_interval(Duration::from_millis(50))
                .spawn();
            std::future::pending::<()>().await;
        }
        // Ingest only: no workers in this process.
        "ingest" => {
            let app = app(&inbox, || async { StatusCode::OK });
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            say(&format!("{LISTENING} {}", listener.local_addr().unwrap()));
            axum::serve(listener, app).await.unwrap();
        }
        other => panic!("unknown child mode {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// The stores
// ---------------------------------------------------------------------------------------

use common::inbox::emptied;
#[cfg(feature = "mysql")]
use common::inbox::mysql;
#[cfg(feature = "postgres")]
use common::inbox::postgres;

#[cfg(feature = "sqlite")]
async fn sqlite(path: &str, table: &str) -> tower_idempotency::store::SqliteStore {
    common::inbox::sqlite(std::path::Path::new(path), table).await
}

// ---------------------------------------------------------------------------------------
// The parent
// ---------------------------------------------------------------------------------------

/// A running child; killed (SIGKILL) and reaped when dropped, should the test fail early.
struct Child {
    process: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Child {
    fn start(mode: &str, db: &str, policy: &str) -> Self {
        let mut process = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "inbox_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_VAR, mode)
            .env(CHILD_DB, db)
            .env(CHILD_POLICY, policy)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the child");
        let stdout = process.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The harness may print the test's name on the same line first.
                let Some(at) = line.find("TOWER-IDEMPOTENCY-INBOX-CHILD") else {
                    continue;
                };
                if tx.send(line[at..].to_owned()).is_err() {
                    break;
                }
            }
        });
        Self { process, lines }
    }

    /// Waits (up to 60 s) for the child's line starting with `marker`.
    async fn said(&mut self, marker: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(line) = self.lines.try_recv()
                && line.starts_with(marker)
            {
                return line;
            }
            if let Ok(Some(status)) = self.process.try_wait() {
                panic!("the child exited before saying {marker}: {status:?}");
            }
            assert!(Instant::now() < deadline, "the child did not say {marker}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGKILL, then reap.
    fn kill(mut self) -> Instant {
        let killed_at = Instant::now();
        self.process.kill().unwrap();
        let status = self.process.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status:?}");
        killed_at
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn delivery(event: &str) -> Request<Full<Bytes>> {
    Request::post("/hooks")
        .header("host", "localhost")
        .header("x-event-id", event)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn event_key(event: &str) -> IdempotencyKey {
    IdempotencyKey::new("default@/hooks", event).unwrap()
}

async fn until(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A worker killed mid-handler, under `policy`; `store` is the parent's handle on the
/// child's table.
async fn worker_killed_mid_handler<St: InboxStore + Clone>(store: St, db: &str, policy: &str) {
    emptied(&store).await;
    let inbox = Inbox::new(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = app(&inbox, move || {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            StatusCode::OK
        }
    });
    let event = "evt-killed";
    let mut child = Child::start("work-and-hang", db, policy);
    // Stored through the parent's ingest; the child's worker takes it.
    let res = tower::ServiceExt::oneshot(app.clone(), delivery(event))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    child.said(RUNNING).await;
    // The parent's workers run all along: the child's heartbeat keeps them off.
    let workers = inbox
        .workers(app)
        .stale(stale(policy))
        .backoff(Backoff::new(LIMIT, LIMIT, 5))
        .poll_interval(Duration::from_millis(50))
        .spawn();
    tokio::time::sleep(LIMIT * 2).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the live worker kept its entry"
    );
    let killed_at = child.kill();
    match policy {
        "reclaim" => {
            until("the reclaimed run", Duration::from_secs(30), async || {
                runs.load(Ordering::SeqCst) > 0
            })
            .await;
            // The limit counts from the child's last renewal: one renew interval before the
            // kill at most, and a little more should a renewal in flight at the kill be lost
            // (a second interval is the margin).
            let earliest = LIMIT - 2 * stale(policy).renew_interval();
            assert!(
                killed_at.elapsed() >= earliest,
                "not before the stale limit after the last renewal"
            );
            until("done", Duration::from_secs(10), async || {
                let entry = store.entry(&event_key(event)).await.unwrap().unwrap();
                entry.state == EntryState::Done
            })
            .await;
            tokio::time::sleep(LIMIT).await;
            let entry = store.entry(&event_key(event)).await.unwrap().unwrap();
            assert_eq!((entry.attempts, entry.crashes), (2, 1), "{entry:?}");
        }
        _ => {
            tokio::time::sleep(LIMIT * 2).await;
            let running = store
                .entries(None, &[EntryState::Running], 10)
                .await
                .unwrap();
            assert_eq!(running.len(), 1, "{running:?}");
            assert!(running[0].since_renewal.unwrap() >= LIMIT);
        }
    }
    workers.stop().await;
    let expected = usize::from(policy == "reclaim");
    assert_eq!(runs.load(Ordering::SeqCst), expected);
}

/// An ingest killed right after its 2xx: another instance's workers run the event.
async fn ingest_killed_after_its_answer<St: InboxStore + Clone>(store: St, db: &str) {
    emptied(&store).await;
    let mut child = Child::start("ingest", db, "reclaim");
    let line = child.said(LISTENING).await;
    let addr: SocketAddr = line.split_whitespace().last().unwrap().parse().unwrap();
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let res = sender.send_request(delivery("evt-ingested")).await.unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    res.into_body().collect().await.unwrap();
    child.kill();

    let inbox = Inbox::new(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = app(&inbox, move || {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            StatusCode::OK
        }
    });
    let workers = inbox
        .workers(app)
        .poll_interval(Duration::from_millis(50))
        .spawn();
    until("the run", Duration::from_secs(30), async || {
        runs.load(Ordering::SeqCst) > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    workers.stop().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The three tests on one database: the child is told `$db`; `$store(table)` opens the
/// parent's store on that table (`None` skips, or fails under `CI`).
macro_rules! crash_tests {
    ($module:ident, $db:expr, $store:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reclaim_after_a_worker_is_killed_runs_the_event_once() {
                let Some(store) = $store(TABLE_RECLAIM).await else {
                    return;
                };
                worker_killed_mid_handler(store, &$db, "reclaim").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn hold_after_a_worker_is_killed_keeps_the_entry_for_a_person() {
                let Some(store) = $store(TABLE_HOLD).await else {
                    return;
                };
                worker_killed_mid_handler(store, &$db, "hold").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_ingest_killed_after_its_answer_loses_nothing() {
                let Some(store) = $store(TABLE_INGEST).await else {
                    return;
                };
                ingest_killed_after_its_answer(store, &$db).await;
            }
        }
    };
}

#[cfg(feature = "postgres")]
crash_tests!(postgres, String::from("postgres"), postgres);
#[cfg(feature = "mysql")]
crash_tests!(mysql, String::from("mysql"), mysql);
#[cfg(feature = "sqlite")]
crash_tests!(sqlite, sqlite_db(), sqlite_store);

/// The SQLite file of these tests, as the child is told it.
#[cfg(feature = "sqlite")]
fn sqlite_db() -> String {
    format!(
        "sqlite:{}",
        common::db::sqlite_file("inbox-crash").display()
    )
}

#[cfg(feature = "sqlite")]
async fn sqlite_store(table: &str) -> Option<tower_idempotency::store::SqliteStore> {
    Some(sqlite(&sqlite_db()["sqlite:".len()..], table).await)
}
