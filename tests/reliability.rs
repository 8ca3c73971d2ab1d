//! Promises kept where real failures happen: the store's database goes away, and clients go
//! away mid-delivery.
//!
//! - Store outage (README: "store unreachable or failing" and "commit fails after the handler
//!   succeeded"): a loopback TCP proxy in front of PostgreSQL is cut and restored, so the shared
//!   server keeps running. While it is cut, deliveries get 503 with `Retry-After` and the
//!   handler never runs; once restored, the sender's retries succeed, and each event ran its
//!   handler exactly once. A cut between handler and commit keeps the handler's response and
//!   leaves the claim to the stale policy.
//! - Client disconnect (DESIGN.md, "Cancellation"): a real hyper server; the client closes its
//!   connection while the handler runs; hyper drops the delivery and the claim is released
//!   (reclaim) or left to the stale path (hold), where `stuck_claims` lists it and `resolve`
//!   settles it: never `processing` forever with nobody to see it.

// Most of these tests need the SQL stores; without them, what only they use is unused.
#![cfg_attr(not(all(feature = "postgres", feature = "sqlite")), allow(unused))]

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::{Notify, Semaphore};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::body::{RequestBody, ResponseBody};
use tower_idempotency::store::{Resolution, Store};
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

    /// Cuts the proxy while the handler of `evt_1` runs, then lets the handler answer 200:
    /// the commit fails, the handler's response stands, and the row stays `processing`.
    async fn cut_between_handler_and_commit(
        stale: Stale,
    ) -> Option<(
        PostgresStore,
        Proxy,
        String,
        Runs,
        impl Service<Request<Full<Bytes>>, Response = Res, Error = Infallible, Future = impl Send>
        + Clone
        + Send
        + 'static,
    )> {
        let (store, proxy) = store_behind_proxy(Duration::from_secs(1)).await?;
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
        open.add_permits(1);
        let took = Instant::now();
        let res = first.await.unwrap().unwrap();
        let took = took.elapsed();
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
            took <= STORE_TIMEOUT + Duration::from_millis(500),
            "{took:?}"
        );
        report(format!(
            "commit cut: the handler's 200 came back after {took:?}"
        ));

        proxy.restore();
        let plain = service(store.clone(), ns.clone(), stale, runs.clone(), None);
        // The claim is still there, so a retry before the limit is told to come back later.
        let res = plain.clone().oneshot(delivery("evt_1")).await.unwrap();
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(outcome(&res), Outcome::InFlight);
        assert_eq!(runs.lock().unwrap()["evt_1"], 1);
        Some((store, proxy, ns, runs, plain))
    }

    const LIMIT: Duration = Duration::from_millis(1000);

    /// Promise: a commit that fails after the handler succeeded keeps the handler's response;
    /// under reclaim, the sender's retry after the limit runs the handler again (a possible
    /// duplicate, never a lost event).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commit_cut_keeps_the_response_then_reclaim_reruns() {
        let Some((store, _proxy, ns, runs, svc)) =
            cut_between_handler_and_commit(Stale::reclaim_after(LIMIT)).await
        else {
            return;
        };
        tokio::time::sleep(LIMIT + Duration::from_millis(200)).await;
        let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
        assert_eq!(outcome(&res), Outcome::Processed);
        let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
        assert_eq!(outcome(&res), Outcome::Duplicate);
        assert_eq!(
            runs.lock().unwrap()["evt_1"],
            2,
            "reclaimed once, then done"
        );
        assert!(stuck_in(&store, &ns, Duration::ZERO).await.is_empty());
    }

    /// Promise: a commit that fails after the handler succeeded keeps the handler's response;
    /// under hold, the claim is listed by stuck_claims and settled by resolve.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commit_cut_keeps_the_response_then_hold_lists_it() {
        let Some((store, _proxy, ns, runs, svc)) =
            cut_between_handler_and_commit(Stale::hold_after(LIMIT)).await
        else {
            return;
        };
        tokio::time::sleep(LIMIT + Duration::from_millis(200)).await;
        let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
        assert_eq!(outcome(&res), Outcome::Held);
        let key = IdempotencyKey::new(ns.clone(), "evt_1").unwrap();
        assert_eq!(stuck_in(&store, &ns, LIMIT).await, vec![key.clone()]);
        // The handler's response said it succeeded: a person marks it done.
        assert!(store.resolve(&key, Resolution::Done).await.unwrap());
        let res = svc.clone().oneshot(delivery("evt_1")).await.unwrap();
        assert_eq!(outcome(&res), Outcome::Duplicate);
        assert_eq!(runs.lock().unwrap()["evt_1"], 1, "ran once");
    }
}

// ---------------------------------------------------------------------------------------
// Client disconnect: a real hyper server, a client that hangs up mid-handler
// ---------------------------------------------------------------------------------------

mod disconnect {
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// Sets its flag when the handler's future is dropped: proof that hyper cancelled it.
    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    struct Server {
        addr: std::net::SocketAddr,
        started: Arc<Notify>,
        dropped: Arc<AtomicBool>,
        runs: Arc<AtomicUsize>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    /// A hyper server whose handler blocks forever on the event `hang`, and answers at once
    /// otherwise.
    async fn serve<St: Store + Clone>(store: St, ns: &str, stale: Stale) -> Server {
        let started = Arc::new(Notify::new());
        let dropped = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicUsize::new(0));
        let (s, d, r) = (started.clone(), dropped.clone(), runs.clone());
        let svc = IdempotencyLayer::new(store)
            .key(key::header("x-event-id").namespace(ns.to_owned()))
            .stale(stale)
            .layer(service_fn(move |req: Request<RequestBody<Incoming>>| {
                let (started, dropped, runs) = (s.clone(), d.clone(), r.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    if req.headers()["x-event-id"] == "hang" {
                        let _flag = DropFlag(dropped);
                        started.notify_one();
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
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
            dropped,
            runs,
            task,
        }
    }

    /// Sends one delivery of `hang` over a raw socket, waits until the handler runs, and
    /// closes the connection. Answers when the server dropped the handler.
    async fn hang_up(server: &Server) -> Duration {
        let mut client = TcpStream::connect(server.addr).await.unwrap();
        client
            .write_all(
                b"POST /hook HTTP/1.1\r\nhost: localhost\r\nx-event-id: hang\r\n\
                  content-length: 0\r\n\r\n",
            )
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), server.started.notified())
            .await
            .expect("the handler started");
        drop(client);
        let closed = Instant::now();
        let deadline = closed + Duration::from_secs(5);
        while !server.dropped.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "hyper never dropped the handler");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        closed.elapsed()
    }

    /// Reclaim: the dropped delivery's claim is released, so the sender's retry runs at once.
    async fn released_under_reclaim<St: Store + Clone>(store: St, name: &str) {
        let ns = common::unique_namespace("hangup-reclaim");
        let server = serve(store.clone(), &ns, Stale::default()).await;
        let dropped_after = hang_up(&server).await;
        // The release runs in a task of its own; wait for it.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if stuck_in(&store, &ns, Duration::ZERO).await.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "the claim was never released");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let released_after = Instant::now();
        // The retry (any event but `hang` answers at once) goes through.
        let key = IdempotencyKey::new(ns.clone(), "hang").unwrap();
        match store.claim(&key, Stale::default()).await.unwrap() {
            tower_idempotency::store::Claim::Acquired(lease) => {
                store.release(&lease).await.unwrap()
            }
            other => panic!("the claim should have been released, got {other:?}"),
        }
        assert_eq!(server.runs.load(Ordering::SeqCst), 1);
        report(format!(
            "disconnect ({name}, reclaim): handler dropped {dropped_after:?} after the hang-up; \
             claim released within {:?} after that",
            released_after.elapsed()
        ));
    }

    /// Hold: the dropped delivery's claim stays, is listed once stale, and is resolved.
    async fn held_under_hold<St: Store + Clone>(store: St, name: &str) {
        const LIMIT: Duration = Duration::from_millis(500);
        let ns = common::unique_namespace("hangup-hold");
        let server = serve(store.clone(), &ns, Stale::hold_after(LIMIT)).await;
        hang_up(&server).await;
        let key = IdempotencyKey::new(ns.clone(), "hang").unwrap();
        // Left for the stale path: still processing, not forever invisible.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            stuck_in(&store, &ns, Duration::ZERO).await,
            vec![key.clone()]
        );
        tokio::time::sleep(LIMIT).await;
        assert_eq!(stuck_in(&store, &ns, LIMIT).await, vec![key.clone()]);
        match store.claim(&key, Stale::hold_after(LIMIT)).await.unwrap() {
            tower_idempotency::store::Claim::Held(_) => {}
            other => panic!("a stale claim under hold is held, got {other:?}"),
        }
        assert!(store.resolve(&key, Resolution::Release).await.unwrap());
        assert!(stuck_in(&store, &ns, Duration::ZERO).await.is_empty());
        assert_eq!(server.runs.load(Ordering::SeqCst), 1);
        report(format!(
            "disconnect ({name}, hold): claim kept, listed after {LIMIT:?}, resolved"
        ));
    }

    #[cfg(feature = "memory")]
    mod memory {
        use tower_idempotency::store::MemoryStore;

        use super::*;

        /// Promise: a client hang-up mid-handler releases the claim under reclaim.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn hang_up_releases_the_claim_under_reclaim() {
            released_under_reclaim(MemoryStore::new(), "memory").await;
        }

        /// Promise: a client hang-up mid-handler leaves the claim to the stale path under hold.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn hang_up_leaves_the_claim_to_hold() {
            held_under_hold(MemoryStore::new(), "memory").await;
        }
    }

    #[cfg(feature = "postgres")]
    mod postgres {
        use super::*;

        /// Promise: a client hang-up mid-handler releases the claim under reclaim.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn hang_up_releases_the_claim_under_reclaim() {
            let Some(store) = common::db::postgres_store().await else {
                return;
            };
            released_under_reclaim(store, "postgres").await;
        }

        /// Promise: a client hang-up mid-handler leaves the claim to the stale path under hold.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn hang_up_leaves_the_claim_to_hold() {
            let Some(store) = common::db::postgres_store().await else {
                return;
            };
            held_under_hold(store, "postgres").await;
        }
    }

    #[cfg(feature = "sqlite")]
    mod sqlite {
        use super::*;

        /// Promise: a client hang-up mid-handler releases the claim under reclaim.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn hang_up_releases_the_claim_under_reclaim() {
            let store = common::db::sqlite_file_store("reliability").await.unwrap();
            released_under_reclaim(store, "sqlite").await;
        }

        /// Promise: a client hang-up mid-handler leaves the claim to the stale path under hold.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn hang_up_leaves_the_claim_to_hold() {
            let store = common::db::sqlite_file_store("reliability").await.unwrap();
            held_under_hold(store, "sqlite").await;
        }
    }
}
