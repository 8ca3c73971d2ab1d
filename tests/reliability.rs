//! Promises kept where real failures happen: the store's database goes away, and clients go
//! away mid-delivery.
//!
//! - Store outage (README: "store unreachable or failing" and "commit fails after the handler
//!   succeeded"): a loopback TCP proxy in front of PostgreSQL is cut and restored, so the shared
//!   server keeps running. While it is cut, deliveries get 503 with `Retry-After` and the
//!   handler never runs; once restored, the sender's retries succeed, and each event ran its
//!   handler exactly once. A cut between handler and commit keeps the handler's response, and
//!   the commit is retried in the background until the store is back.
//! - Client disconnect (DESIGN.md, "The delivery lifecycle"): a real hyper server on every
//!   store; the sender hangs up while a handler slower than its timeout runs, then retries:
//!   the handler runs to its end once, its claim renewed past three stale limits, the retries
//!   get 409 while it runs and 200 once it committed.

// Most of these tests need the SQL stores; without them, what only they use is unused.
#![cfg_attr(not(all(feature = "postgres", feature = "sqlite")), allow(unused))]

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::{Notify, Semaphore};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::body::{RequestBody, ResponseBody};
use tower_idempotency::store::Store;
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Outcome, Stale, key};

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

/// Writes a measurement where `cargo test` shows it even for passing tests.
fn report(line: String) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "reliability: {line}");
}

async fn stuck_in<St: Store>(store: &St, ns: &str, older_than: Duration) -> Vec<IdempotencyKey> {
    store
        .stuck_claims(older_than)
        .await
        .unwrap()
        .into_iter()
        .filter(|s| s.key.namespace() == ns)
        .map(|s| s.key)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Store outage: PostgreSQL behind a proxy that is cut and restored
// ---------------------------------------------------------------------------------------

#[cfg(feature = "postgres")]
mod outage {
    use std::str::FromStr;

    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use tokio::net::lookup_host;
    use tower_idempotency::store::PostgresStore;

    use super::*;
    use crate::common::proxy::Proxy;

    const STORE_TIMEOUT: Duration = Duration::from_secs(2);

    /// A migrated store whose every connection goes through a new proxy; the pool gives up
    /// acquiring a connection after `acquire_timeout`.
    async fn store_behind_proxy(acquire_timeout: Duration) -> Option<(PostgresStore, Proxy)> {
        let url = common::db::postgres_url();
        let options = PgConnectOptions::from_str(&url).expect("POSTGRES_URL");
        let upstream = lookup_host((options.get_host(), options.get_port()))
            .await
            .ok()?
            .next()?;
        let proxy = Proxy::start(upstream).await;
        let options = options.host("127.0.0.1").port(proxy.addr().port());
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(acquire_timeout)
            .connect_with(options);
        let pool = common::connect("POSTGRES_URL", &url, pool).await?;
        let store = PostgresStore::new(pool);
        store.migrate().await.expect("migrate");
        Some((store, proxy))
    }

    /// The handler counts its runs per event.
    type Runs = Arc<Mutex<HashMap<String, usize>>>;

    fn service(
        store: PostgresStore,
        ns: String,
        stale: Stale,
        runs: Runs,
        gate: Option<(Arc<Notify>, Arc<Semaphore>)>,
    ) -> impl Service<Request<Full<Bytes>>, Response = Res, Error = Infallible, Future = impl Send>
    + Clone
    + Send
    + 'static {
        IdempotencyLayer::new(store)
            .key(key::header("x-event-id").namespace(ns))
            .stale(stale)
            .store_timeout(STORE_TIMEOUT)
            .retry_after(Duration::from_secs(1))
            .layer(service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
                let (runs, gate) = (runs.clone(), gate.clone());
                async move {
                    let event = req.headers()["x-event-id"].to_str().unwrap().to_owned();
                    *runs.lock().unwrap().entry(event).or_default() += 1;
                    if let Some((started, open)) = gate {
                        started.notify_one();
                        open.acquire().await.unwrap().forget();
                    }
                    Ok(Response::new(Full::new(Bytes::from_static(b"handled"))))
                }
            }))
    }

    /// Promise: store unreachable means 503 with Retry-After and no handler run; after the
    /// outage the sender's retries go through and nothing is lost or doubled.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn outage_answers_503_and_loses_nothing() {
        let Some((store, proxy)) = store_behind_proxy(Duration::from_secs(1)).await else {
            return;
        };
        let ns = common::unique_namespace("outage");
        let runs = Runs::default();
        let svc = service(
            store.clone(),
            ns.clone(),
            Stale::default(),
            runs.clone(),
            None,
        );

        let res = svc.clone().oneshot(delivery("evt_0")).await.unwrap();
        assert_eq!(outcome(&res), Outcome::Processed);

        proxy.cut();
        let mut slowest = Duration::ZERO;
        for i in 1..=10 {
            let started = Instant::now();
            let res = svc
                .clone()
                .oneshot(delivery(&format!("evt_{i}")))
                .await
                .unwrap();
            slowest = slowest.max(started.elapsed());
            assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(outcome(&res), Outcome::StoreUnavailable);
            assert_eq!(res.headers()["retry-after"], "1");
            assert_eq!(res.headers()["content-type"], "application/problem+json");
        }
        // A duplicate of a done event cannot be told from a new one without the store: 503 too.
        let res = svc.clone().oneshot(delivery("evt_0")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            runs.lock().unwrap().keys().all(|k| k == "evt_0"),
            "the handler never ran unguarded: {runs:?}"
        );
        assert!(slowest <= STORE_TIMEOUT + Duration::from_millis(500));

        proxy.restore();
        // The sender retries every event until it is acknowledged, concurrently.
        let started = Instant::now();
        let tasks: Vec<_> = (0..=10)
            .map(|i| {
                let svc = svc.clone();
                tokio::spawn(async move {
                    for attempt in 1..=20 {
                        let res = svc.clone().oneshot(delivery(&format!("evt_{i}"))).await;
                        let res = res.unwrap();
                        if res.status().is_success() {
                            return (outcome(&res), attempt);
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    panic!("evt_{i} was never acknowledged after the outage");
                })
            })
            .collect();
        let mut retried = 0;
        for (i, task) in tasks.into_iter().enumerate() {
            let (outcome, attempts) = task.await.unwrap();
            retried += attempts - 1;
            let expected = if i == 0 {
                Outcome::Duplicate
            } else {
                Outcome::Processed
            };
            assert_eq!(outcome, expected, "evt_{i}");
        }
        let runs = runs.lock().unwrap().clone();
        assert_eq!(runs.len(), 11, "no event lost: {runs:?}");
        assert!(runs.values().all(|n| *n == 1), "no event doubled: {runs:?}");
        assert!(stuck_in(&store, &ns, Duration::ZERO).await.is_empty());
        report(format!(
            "outage: 503 within {slowest:?} (store_timeout {STORE_TIMEOUT:?}); recovered in \
             {:?} with {retried} extra attempts; {} connections refused while cut",
            started.elapsed(),
            proxy.refused()
        ));
    }

    /// Promise: a store that hangs instead of failing (a partition that drops packets) is
    /// answered 503 within the layer's `store_timeout`, the handler never runs, and the
    /// sender's retries after the partition heals each run the handler once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stalled_store_answers_503_within_store_timeout() {
        // The pool would wait far longer: the layer's own bound is what answers.
        let Some((store, proxy)) = store_behind_proxy(Duration::from_secs(30)).await else {
            return;
        };
        let ns = common::unique_namespace("stall");
        let runs = Runs::default();
        let svc = service(
            store.clone(),
            ns.clone(),
            Stale::default(),
            runs.clone(),
            None,
        );

        proxy.stall();
        let started = Instant::now();
        let tasks: Vec<_> = (1..=4)
            .map(|i| tokio::spawn(svc.clone().oneshot(delivery(&format!("evt_{i}")))))
            .collect();
        let mut slowest = Duration::ZERO;
        for task in tasks {
            let res = task.await.unwrap().unwrap();
            slowest = slowest.max(started.elapsed());
            assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert!(res.headers().contains_key("retry-after"));
        }
        assert!(runs.lock().unwrap().is_empty(), "the handler never ran");
        assert!(
            slowest >= STORE_TIMEOUT && slowest <= STORE_TIMEOUT + Duration::from_millis(700),
            "bounded by store_timeout: {slowest:?}"
        );

        proxy.restore();
        for i in 1..=4 {
            let event = format!("evt_{i}");
            let mut acknowledged = false;
            for _ in 0..20 {
                let res = svc.clone().oneshot(delivery(&event)).await.unwrap();
                if res.status().is_success() {
                    assert_eq!(outcome(&res), Outcome::Processed);
                    acknowledged = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(acknowledged, "{event} acknowledged after the stall");
        }
        let runs = runs.lock().unwrap().clone();
        assert_eq!(runs.len(), 4, "{runs:?}");
        assert!(runs.values().all(|n| *n == 1), "{runs:?}");
        assert!(stuck_in(&store, &ns, Duration::ZERO).await.is_empty());
        report(format!(
            "stall: 503 after {slowest:?} (store_timeout {STORE_TIMEOUT:?})"
        ));
    }

    /// Cuts the proxy while the handler of `evt_1` runs, lets the handler answer 200, and
    /// restores the proxy `outage` later: the handler's response stands at once, the commit
    /// is retried in the background until it lands, and the event is done, run once.
    async fn commit_cut_is_retried(stale: Stale, name: &str) {
        const OUTAGE: Duration = Duration::from_secs(2);
        let Some((store, proxy)) = store_behind_proxy(Duration::from_secs(1)).await else {
            return;
        };
        let ns = common::unique_namespace("commit-cut");
        let runs = Runs::default();
        let started = Arc::new(Notify::new());
        let open = Arc::new(Semaphore::new(0));
        let gated = service(
            store.clone(),
            ns.clone(),
            stale,
            runs.clone(),
            Some((started.clone(), open.clone())),
        );
        let first = tokio::spawn(gated.oneshot(delivery("evt_1")));
        started.notified().await;
        proxy.cut();
        let cut = Instant::now();
        open.add_permits(1);
        let res = first.await.unwrap().unwrap();
        let answered = cut.elapsed();
        assert_eq!(
            res.status(),
            StatusCode::OK,
            "the handler's response stands"
        );
        assert_eq!(outcome(&res), Outcome::Processed);
        assert!(
            !res.headers().contains_key("idempotency-outcome"),
            "it is the handler's own answer"
        );
        let body = http_body_util::BodyExt::collect(res.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(body, "handled");
        assert!(
            answered <= STORE_TIMEOUT + Duration::from_millis(500),
            "{answered:?}"
        );

        tokio::time::sleep(OUTAGE.saturating_sub(cut.elapsed())).await;
        proxy.restore();
        let plain = service(store.clone(), ns.clone(), stale, runs.clone(), None);
        let key = IdempotencyKey::new(ns.clone(), "evt_1").unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let res = plain.clone().oneshot(delivery("evt_1")).await.unwrap();
            match outcome(&res) {
                Outcome::Duplicate => break,
                // Retried in the background meanwhile: come back later.
                Outcome::InFlight => assert_eq!(res.status(), StatusCode::CONFLICT),
                // The pool is still reconnecting.
                Outcome::StoreUnavailable => {}
                other => panic!("unexpected {other:?}"),
            }
            assert!(Instant::now() < deadline, "the commit never landed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let settled = cut.elapsed();
        assert_eq!(runs.lock().unwrap()["evt_1"], 1, "run once, committed late");
        let record = store.describe(&key).await.unwrap().unwrap();
        assert_eq!(record.runs, 1);
        assert!(stuck_in(&store, &ns, Duration::ZERO).await.is_empty());
        report(format!(
            "commit cut ({name}): the handler's 200 came back {answered:?} after the cut; \
             store back after {OUTAGE:?}; the retried commit landed, done {settled:?} after the cut"
        ));
    }

    const LIMIT: Duration = Duration::from_secs(10);

    /// Promise: a commit that fails after the handler succeeded keeps the handler's response,
    /// and is retried until the store is back: finished work does not stay `processing`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commit_cut_is_retried_under_reclaim() {
        commit_cut_is_retried(Stale::reclaim_after(LIMIT), "reclaim").await;
    }

    /// Promise: the same under hold: nothing is left for a person to resolve.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commit_cut_is_retried_under_hold() {
        commit_cut_is_retried(Stale::hold_after(LIMIT), "hold").await;
    }
}

// ---------------------------------------------------------------------------------------
// Client disconnect: a real hyper server, a sender that hangs up mid-handler and retries
// ---------------------------------------------------------------------------------------

mod disconnect {
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// How long the handler works: longer than the sender waits, and three stale limits.
    const WORK: Duration = Duration::from_millis(1200);
    /// The stale limit: the heartbeat (every 100 ms) must keep the claim through the work.
    const LIMIT: Duration = Duration::from_millis(400);
    /// How long the sender waits for an answer after the handler started, before it hangs up.
    const SENDER_TIMEOUT: Duration = Duration::from_millis(150);

    struct Server {
        addr: std::net::SocketAddr,
        started: Arc<AtomicUsize>,
        finished: Arc<AtomicUsize>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    /// A hyper server whose handler counts a start, works for [`WORK`], counts a finish and
    /// answers 202.
    async fn serve<St: Store + Clone>(store: St, ns: &str, stale: Stale) -> Server {
        let started = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicUsize::new(0));
        let (s, f) = (started.clone(), finished.clone());
        let svc = IdempotencyLayer::new(store)
            .key(key::header("x-event-id").namespace(ns.to_owned()))
            .stale(stale)
            .retry_after(Duration::from_secs(1))
            .layer(service_fn(move |_req: Request<RequestBody<Incoming>>| {
                let (started, finished) = (s.clone(), f.clone());
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(WORK).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                    let mut res = Response::new(Full::new(Bytes::from_static(b"accepted")));
                    *res.status_mut() = StatusCode::ACCEPTED;
                    Ok::<_, Infallible>(res)
                }
            }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let svc = TowerToHyperService::new(svc.clone());
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Server {
            addr,
            started,
            finished,
            task,
        }
    }

    const REQUEST: &[u8] = b"POST /hook HTTP/1.1\r\nhost: localhost\r\nx-event-id: evt_slow\r\n\
        content-length: 0\r\nconnection: close\r\n\r\n";

    /// One delivery as a sender makes it: the status and the headers, or `None` when the
    /// sender's timeout came first (it then hangs up).
    async fn send(addr: std::net::SocketAddr, wait: Duration) -> Option<(u16, String)> {
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(REQUEST).await.unwrap();
        let mut answer = Vec::new();
        match tokio::time::timeout(wait, client.read_to_end(&mut answer)).await {
            Err(_elapsed) => None,
            Ok(read) => {
                read.unwrap();
                let text = String::from_utf8_lossy(&answer).into_owned();
                let status = text.split(' ').nth(1).unwrap().parse().unwrap();
                Some((status, text.to_ascii_lowercase()))
            }
        }
    }

    /// The first delivery, whose sender hangs up [`SENDER_TIMEOUT`] after the handler started
    /// (a busy machine may take longer than that to claim: the sender's timeout then ends a
    /// delivery that never held the claim, which is not the case under test).
    async fn send_then_hang_up(addr: std::net::SocketAddr, started: &AtomicUsize) {
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(REQUEST).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while started.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the handler never started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut answer = Vec::new();
        let read = tokio::time::timeout(SENDER_TIMEOUT, client.read_to_end(&mut answer)).await;
        assert!(
            read.is_err(),
            "the sender hangs up before the handler answers"
        );
    }

    /// The sender gives up while the handler runs and retries every 100 ms: the handler
    /// started once runs to its end and commits; the retries get 409 with `Retry-After` while
    /// it runs (its claim renewed past three stale limits, never taken over), then 200.
    async fn hang_up_then_retry<St: Store + Clone>(store: St, name: &str, stale: Stale) {
        let ns = common::unique_namespace("hangup");
        let server = serve(store.clone(), &ns, stale).await;
        send_then_hang_up(server.addr, &server.started).await;
        let hung_up = Instant::now();
        assert_eq!(server.started.load(Ordering::SeqCst), 1);

        let mut in_flight = 0;
        let duplicate = loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let (status, head) = send(server.addr, Duration::from_secs(5)).await.unwrap();
            match status {
                409 => {
                    assert!(head.contains("retry-after: 1"), "{head}");
                    assert!(head.contains("idempotency-outcome: in-flight"), "{head}");
                    in_flight += 1;
                }
                200 => break head,
                other => panic!("unexpected {other}: {head}"),
            }
            assert!(
                hung_up.elapsed() < WORK * 4,
                "the first delivery never finished"
            );
        };
        assert!(
            duplicate.contains("idempotency-outcome: duplicate"),
            "{duplicate}"
        );
        assert!(in_flight >= 5, "retries while the work ran: {in_flight}");
        assert_eq!(
            server.started.load(Ordering::SeqCst),
            1,
            "the work started once"
        );
        assert_eq!(server.finished.load(Ordering::SeqCst), 1, "and finished");

        let key = IdempotencyKey::new(ns.clone(), "evt_slow").unwrap();
        let record = store.describe(&key).await.unwrap().unwrap();
        assert_eq!(record.state, tower_idempotency::store::KeyState::Done);
        assert_eq!(record.runs, 1);
        assert!(record.deliveries >= 2 + in_flight);
        assert!(stuck_in(&store, &ns, Duration::ZERO).await.is_empty());
        report(format!(
            "disconnect ({name}, {:?}): work of {WORK:?} under a stale limit of {LIMIT:?} \
             started once, finished, committed; {in_flight} retries got 409 meanwhile",
            stale.policy()
        ));
    }

    macro_rules! disconnect_tests {
        ($module:ident, $feature:literal, $make:expr) => {
            #[cfg(feature = $feature)]
            mod $module {
                use super::*;

                /// Promise: a sender that hangs up on a slow handler, then retries, gets the
                /// work done once (reclaim).
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn hang_up_runs_the_handler_to_completion_under_reclaim() {
                    let Some(store) = $make else { return };
                    hang_up_then_retry(store, stringify!($module), Stale::reclaim_after(LIMIT))
                        .await;
                }

                /// Promise: the same under hold, and nothing is left for a person.
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn hang_up_runs_the_handler_to_completion_under_hold() {
                    let Some(store) = $make else { return };
                    hang_up_then_retry(store, stringify!($module), Stale::hold_after(LIMIT)).await;
                }
            }
        };
    }

    disconnect_tests!(
        memory,
        "memory",
        Some(tower_idempotency::store::MemoryStore::new())
    );
    disconnect_tests!(postgres, "postgres", common::db::postgres_store().await);
    disconnect_tests!(
        sqlite,
        "sqlite",
        common::db::sqlite_file_store("reliability").await
    );
    disconnect_tests!(mysql, "mysql", common::db::mysql_store().await);
}
