//! Promise: a process killed between claim and side effect leaves an outcome that matches the
//! stale policy (DESIGN.md, "Tests that matter" 4; README, "stale claim" rows), and
//! transactional mode leaves nothing behind at all.
//!
//! Each test re-runs this test binary as a child process (the `crash_child` test, switched on
//! by `TOWER_IDEMPOTENCY_CHILD`). The child builds the layer over the same database, takes one
//! delivery, and its handler prints a line and hangs. The parent waits for that line, kills
//! the child with SIGKILL (no destructor, no drop guard, no rollback runs in the child), and
//! then plays the sender's retries in-process:
//!
//! - while the child lives (two limits of 1.5 s), its heartbeat keeps the claim: a retry is
//!   answered 409 in flight, neither reclaimed nor held;
//! - reclaim: a retry before the limit from the kill (the last heartbeat) is answered 409;
//!   after it, the handler runs exactly once, and later retries are duplicates;
//! - hold: the retry is answered 409 and the handler does not run, the `on_held` hook fires,
//!   `stuck_claims` lists the key, `resolve` settles it, and the next retry runs the handler
//!   exactly once;
//! - transactional: the child held an open transaction with a business write; the retry runs
//!   at once (no stale limit to wait for) and the business row exists exactly once.
//!
//! On PostgreSQL, MariaDB (claim-then-commit) and a SQLite file.

#![cfg(all(unix, any(feature = "postgres", feature = "sqlite", feature = "mysql")))]

mod common;

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::body::{RequestBody, ResponseBody};
use tower_idempotency::store::{Resolution, Store};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Outcome, Stale, key};

/// Switches the `crash_child` test into the child's role; its value is the mode.
const CHILD_VAR: &str = "TOWER_IDEMPOTENCY_CHILD";
/// `postgres`, or `sqlite:<path>`.
const CHILD_DB: &str = "TOWER_IDEMPOTENCY_CHILD_DB";
const CHILD_NS: &str = "TOWER_IDEMPOTENCY_CHILD_NS";
const CHILD_EVENT: &str = "TOWER_IDEMPOTENCY_CHILD_EVENT";
/// What the child's handler prints once it holds the claim (or its open transaction).
const CLAIMED: &str = "TOWER-IDEMPOTENCY-CHILD-CLAIMED";

/// The stale limit of the sender's retries in the parent.
const LIMIT: Duration = Duration::from_millis(1500);

type Res = Response<ResponseBody<Full<Bytes>>>;

fn delivery(event: &str) -> Request<Full<Bytes>> {
    Request::post("/hook")
        .header("x-event-id", event)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn outcome(res: &Res) -> Outcome {
    *res.extensions().get::<Outcome>().unwrap()
}

// ---------------------------------------------------------------------------------------
// The child
// ---------------------------------------------------------------------------------------

/// The child process. Without `TOWER_IDEMPOTENCY_CHILD` it does nothing and passes.
#[test]
fn crash_child() {
    let Ok(mode) = std::env::var(CHILD_VAR) else {
        return;
    };
    let db = std::env::var(CHILD_DB).expect(CHILD_DB);
    let ns = std::env::var(CHILD_NS).expect(CHILD_NS);
    let event = std::env::var(CHILD_EVENT).expect(CHILD_EVENT);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        // Should the parent die without killing us, do not linger.
        let served = tokio::time::timeout(Duration::from_secs(120), child(&mode, &db, ns, &event));
        let _ = served.await;
        std::process::exit(3);
    });
}

/// Prints the marker line and never returns: the process is killed while it waits here.
async fn claimed_and_hang() -> ! {
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{CLAIMED}").unwrap();
        out.flush().unwrap();
    }
    std::future::pending::<()>().await;
    unreachable!()
}

/// Transactional mode: the handler writes its business row in the delivery's open
/// transaction, then hangs before the layer can commit it.
macro_rules! tx_child {
    ($store:expr, $ns:expr, $event:expr, $db:ty, $insert:literal) => {{
        use tower_idempotency::transactional::{TransactionalLayer, TxHandle};
        let business = format!("{}/{}", $ns, $event);
        let svc = TransactionalLayer::new($store)
            .key(key::header("x-event-id").namespace($ns))
            .layer(service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
                let business = business.clone();
                async move {
                    let handle = req.extensions().get::<TxHandle<$db>>().unwrap().clone();
                    let mut tx = handle.lock().unwrap();
                    sqlx::query($insert)
                        .bind(&business)
                        .execute(&mut *tx)
                        .await?;
                    claimed_and_hang().await;
                    #[allow(unreachable_code)]
                    Ok::<_, sqlx::Error>(Response::new(Full::new(Bytes::new())))
                }
            }));
        let _ = svc.oneshot(delivery($event)).await;
    }};
}

async fn child(mode: &str, db: &str, ns: String, event: &str) {
    match (mode, db) {
        #[cfg(feature = "postgres")]
        ("claim-and-hang", "postgres") => {
            claim_and_hang(common::db::postgres_store().await.unwrap(), ns, event).await
        }
        #[cfg(feature = "mysql")]
        ("claim-and-hang", "mysql") => {
            claim_and_hang(common::db::mysql_store().await.unwrap(), ns, event).await
        }
        #[cfg(feature = "sqlite")]
        ("claim-and-hang", path) if path.starts_with("sqlite:") => {
            let pool =
                common::db::sqlite_file_pool(std::path::Path::new(&path["sqlite:".len()..])).await;
            let store = tower_idempotency::store::SqliteStore::new(pool);
            claim_and_hang(store, ns, event).await
        }
        #[cfg(feature = "postgres")]
        ("tx-and-hang", "postgres") => {
            let store = common::db::postgres_store().await.unwrap();
            tx_child!(
                store,
                ns,
                event,
                sqlx::Postgres,
                "INSERT INTO crash_effects (event) VALUES ($1)"
            )
        }
        #[cfg(feature = "sqlite")]
        ("tx-and-hang", path) if path.starts_with("sqlite:") => {
            let pool =
                common::db::sqlite_file_pool(std::path::Path::new(&path["sqlite:".len()..])).await;
            let store = tower_idempotency::store::SqliteStore::new(pool);
            tx_child!(
                store,
                ns,
                event,
                sqlx::Sqlite,
                "INSERT INTO crash_effects (event) VALUES (?1)"
            )
        }
        other => panic!("unknown child {other:?}"),
    }
}

/// Claim-then-commit mode: the claim is taken, the handler starts its side effect and hangs;
/// the heartbeat renews the claim (every `LIMIT / 4`) until the process is killed.
async fn claim_and_hang<St: Store + Clone>(store: St, ns: String, event: &str) {
    let svc = IdempotencyLayer::new(store)
        .key(key::header("x-event-id").namespace(ns))
        .stale(Stale::reclaim_after(LIMIT))
        .layer(service_fn(
            |_req: Request<RequestBody<Full<Bytes>>>| async {
                claimed_and_hang().await;
                #[allow(unreachable_code)]
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            },
        ));
    let _ = svc.oneshot(delivery(event)).await;
}

// ---------------------------------------------------------------------------------------
// The parent
// ---------------------------------------------------------------------------------------

/// A running child; killed (SIGKILL) and reaped when dropped, should the test fail early.
struct Child {
    process: std::process::Child,
    /// When the child's handler announced it held the claim.
    claimed_at: Instant,
}

impl Child {
    /// Starts the child and waits (up to 60 s) until its handler holds the claim.
    async fn start(mode: &str, db: &str, ns: &str, event: &str) -> Self {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_VAR, mode)
            .env(CHILD_DB, db)
            .env(CHILD_NS, ns)
            .env(CHILD_EVENT, event)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut process = command.spawn().expect("start the child");
        let stdout = process.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.contains(CLAIMED) {
                    let _ = tx.send(());
                }
            }
        });
        let mut child = Self {
            process,
            claimed_at: Instant::now(),
        };
        let seen = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(60)))
            .await
            .unwrap();
        if seen.is_err() {
            let status = child.process.try_wait();
            panic!("the child did not report its claim within 60 s (status {status:?})");
        }
        child.claimed_at = Instant::now();
        child
    }

    /// SIGKILL, then reap; answers when the child was killed, which is its last heartbeat at
    /// the latest. Nothing in the child gets to run: no drop guard, no rollback.
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

/// The sender's retries, through a layer over the parent's own store handle.
fn sender<St: Store + Clone>(
    store: St,
    ns: &str,
    stale: Stale,
    runs: Arc<AtomicUsize>,
    held: Arc<AtomicUsize>,
) -> impl tower::Service<Request<Full<Bytes>>, Response = Res, Error = Infallible> + Clone {
    IdempotencyLayer::new(store)
        .key(key::header("x-event-id").namespace(ns.to_owned()))
        .stale(stale)
        .on_held(move |_, _| {
            held.fetch_add(1, Ordering::SeqCst);
        })
        .layer(service_fn(
            move |_req: Request<RequestBody<Full<Bytes>>>| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"sent"))))
                }
            },
        ))
}

async fn sleep_until(at: Instant) {
    tokio::time::sleep_until(at.into()).await;
}

/// While the child lives, its heartbeat keeps the claim: two stale limits after the claim, a
/// retry (under `stale`) is still answered 409 in flight, and the row was renewed recently.
async fn alive_child_keeps_its_claim<St: Store + Clone>(
    store: &St,
    svc: impl tower::Service<Request<Full<Bytes>>, Response = Res, Error = Infallible>,
    ns: &str,
    claimed_at: Instant,
) {
    sleep_until(claimed_at + 2 * LIMIT).await;
    let res = svc.oneshot(delivery("evt_1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(
        outcome(&res),
        Outcome::InFlight,
        "renewed: neither reclaimed nor held"
    );
    let key = IdempotencyKey::new(ns.to_owned(), "evt_1").unwrap();
    let record = store.describe(&key).await.unwrap().unwrap();
    assert!(record.claimed_ago >= 2 * LIMIT, "{record:?}");
    assert!(record.renewed_ago.unwrap() < LIMIT, "{record:?}");
}

/// Reclaim: the retry one limit after the last heartbeat runs the handler exactly once.
async fn reclaim_after_kill<St: Store + Clone>(store: St, db: &str) {
    let ns = common::unique_namespace("crash-reclaim");
    let child = Child::start("claim-and-hang", db, &ns, "evt_1").await;

    let runs = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let svc = sender(
        store.clone(),
        &ns,
        Stale::reclaim_after(LIMIT),
        runs.clone(),
        held.clone(),
    );
    alive_child_keeps_its_claim(&store, svc.clone(), &ns, child.claimed_at).await;
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // Its last heartbeat came at most now.
    let killed_at = child.kill();

    // Before the limit the dead child's claim still counts as in flight (unless this machine
    // was too slow to get here in time, which proves nothing either way).
    if killed_at.elapsed() < LIMIT - Duration::from_millis(500) {
        let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(outcome(&res), Outcome::InFlight);
        assert!(res.headers().contains_key("retry-after"));
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }

    sleep_until(killed_at + LIMIT + Duration::from_millis(200)).await;
    let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(outcome(&res), Outcome::Processed);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the retry ran the handler");

    for _ in 0..3 {
        let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(outcome(&res), Outcome::Duplicate);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "exactly once");
    assert_eq!(held.load(Ordering::SeqCst), 0);
    let stuck = stuck_in(&store, &ns, Duration::ZERO).await;
    assert!(stuck.is_empty(), "{stuck:?}");
}

/// Hold: the retry does not run the handler; the claim is listed and settled by hand.
async fn hold_after_kill<St: Store + Clone>(store: St, db: &str) {
    let ns = common::unique_namespace("crash-hold");
    let child = Child::start("claim-and-hang", db, &ns, "evt_1").await;

    let runs = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let svc = sender(
        store.clone(),
        &ns,
        Stale::hold_after(LIMIT),
        runs.clone(),
        held.clone(),
    );
    alive_child_keeps_its_claim(&store, svc.clone(), &ns, child.claimed_at).await;
    assert_eq!(held.load(Ordering::SeqCst), 0, "a live claim is not held");
    let killed_at = child.kill();

    sleep_until(killed_at + LIMIT + Duration::from_millis(200)).await;
    for attempt in 1..=2 {
        let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(outcome(&res), Outcome::Held);
        assert_eq!(
            held.load(Ordering::SeqCst),
            attempt,
            "the on_held hook fired"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "hold never runs the handler"
    );

    let stuck = stuck_in(&store, &ns, LIMIT).await;
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(
        stuck[0].0,
        IdempotencyKey::new(ns.clone(), "evt_1").unwrap()
    );
    assert!(stuck[0].1 >= 2 * LIMIT, "age {:?}", stuck[0].1);
    assert_eq!(stuck[0].2, 4, "the child's delivery and three retries");

    // A person finds the side effect did not happen and releases the claim.
    let key = IdempotencyKey::new(ns.clone(), "evt_1").unwrap();
    assert!(store.resolve(&key, Resolution::Release).await.unwrap());
    let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
    assert_eq!(outcome(&res), Outcome::Processed);
    let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
    assert_eq!(outcome(&res), Outcome::Duplicate);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "exactly once after resolve");
    assert!(stuck_in(&store, &ns, Duration::ZERO).await.is_empty());
}

async fn stuck_in<St: Store>(
    store: &St,
    ns: &str,
    older_than: Duration,
) -> Vec<(IdempotencyKey, Duration, u64)> {
    store
        .stuck_claims(older_than)
        .await
        .unwrap()
        .into_iter()
        .filter(|s| s.key.namespace() == ns)
        .map(|s| (s.key, s.age, s.deliveries))
        .collect()
}

/// Transactional mode: the killed child's transaction (marker and business row) rolls back;
/// the retry runs at once and the business row exists exactly once.
macro_rules! tx_after_kill {
    ($store:expr, $db_arg:expr, $db:ty,
     $create:literal, $insert:literal, $count:literal, $markers:literal) => {{
        use tower_idempotency::transactional::{TransactionalLayer, TxHandle};
        let store = $store;
        sqlx::query($create).execute(store.pool()).await.unwrap();
        let ns = common::unique_namespace("crash-tx");
        let business = format!("{ns}/evt_1");
        let child = Child::start("tx-and-hang", $db_arg, &ns, "evt_1").await;
        child.kill();

        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let row = business.clone();
        let svc = TransactionalLayer::new(store.clone())
            .key(key::header("x-event-id").namespace(ns.clone()))
            .lock_timeout(Duration::from_secs(10))
            .layer(service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
                let (runs, row) = (r.clone(), row.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let handle = req.extensions().get::<TxHandle<$db>>().unwrap().clone();
                    let mut tx = handle.lock().unwrap();
                    sqlx::query($insert).bind(&row).execute(&mut *tx).await?;
                    Ok::<_, sqlx::Error>(Response::new(Full::new(Bytes::new())))
                }
            }));

        // At once: there is no processing row and no stale limit to wait for.
        let started = Instant::now();
        let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
        let took = started.elapsed();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(outcome(&res), Outcome::Processed);
        assert!(
            took < LIMIT,
            "the retry ran at once, not after a stale limit: {took:?}"
        );
        let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
        assert_eq!(outcome(&res), Outcome::Duplicate);
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        let rows: i64 = sqlx::query_scalar($count)
            .bind(&business)
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(
            rows, 1,
            "the child's write rolled back; the retry's committed"
        );
        let markers: i64 = sqlx::query_scalar($markers)
            .bind(&ns)
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(markers, 1);
        assert!(stuck_in(&store, &ns, Duration::ZERO).await.is_empty());
        let _ = std::io::stderr().write_all(
            format!("crash: transactional retry after SIGKILL answered in {took:?}\n").as_bytes(),
        );
    }};
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    /// Promise: reclaim after a kill -9 runs the retry exactly once, after the limit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reclaim_after_sigkill_runs_the_retry_once() {
        let Some(store) = common::db::postgres_store().await else {
            return;
        };
        reclaim_after_kill(store, "postgres").await;
    }

    /// Promise: hold after a kill -9 never runs the retry; stuck_claims lists it, resolve
    /// settles it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hold_after_sigkill_waits_for_resolve() {
        let Some(store) = common::db::postgres_store().await else {
            return;
        };
        hold_after_kill(store, "postgres").await;
    }

    /// Promise: transactional mode commits nothing for a killed delivery; the retry runs at
    /// once and writes once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transactional_after_sigkill_retries_at_once() {
        let Some(store) = common::db::postgres_store().await else {
            return;
        };
        tx_after_kill!(
            store,
            "postgres",
            sqlx::Postgres,
            "CREATE TABLE IF NOT EXISTS crash_effects (event VARCHAR(255) NOT NULL)",
            "INSERT INTO crash_effects (event) VALUES ($1)",
            "SELECT COUNT(*) FROM crash_effects WHERE event = $1",
            "SELECT COUNT(*) FROM idempotency_keys WHERE namespace = $1"
        );
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    fn db_arg() -> String {
        format!("sqlite:{}", common::db::sqlite_file("crash").display())
    }

    /// Promise: reclaim after a kill -9 runs the retry exactly once, after the limit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reclaim_after_sigkill_runs_the_retry_once() {
        let store = common::db::sqlite_file_store("crash").await.unwrap();
        reclaim_after_kill(store, &db_arg()).await;
    }

    /// Promise: hold after a kill -9 never runs the retry; stuck_claims lists it, resolve
    /// settles it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hold_after_sigkill_waits_for_resolve() {
        let store = common::db::sqlite_file_store("crash").await.unwrap();
        hold_after_kill(store, &db_arg()).await;
    }

    /// Promise: transactional mode commits nothing for a killed delivery; the retry runs at
    /// once and writes once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transactional_after_sigkill_retries_at_once() {
        let store = common::db::sqlite_file_store("crash").await.unwrap();
        tx_after_kill!(
            store,
            &db_arg(),
            sqlx::Sqlite,
            "CREATE TABLE IF NOT EXISTS crash_effects (event VARCHAR(255) NOT NULL)",
            "INSERT INTO crash_effects (event) VALUES (?1)",
            "SELECT COUNT(*) FROM crash_effects WHERE event = ?1",
            "SELECT COUNT(*) FROM idempotency_keys WHERE namespace = ?1"
        );
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;

    /// Promise: reclaim after a kill -9 runs the retry exactly once, after the limit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reclaim_after_sigkill_runs_the_retry_once() {
        let Some(store) = common::db::mysql_store().await else {
            return;
        };
        reclaim_after_kill(store, "mysql").await;
    }

    /// Promise: hold after a kill -9 never runs the retry; stuck_claims lists it, resolve
    /// settles it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hold_after_sigkill_waits_for_resolve() {
        let Some(store) = common::db::mysql_store().await else {
            return;
        };
        hold_after_kill(store, "mysql").await;
    }
}
