//! Promises of the delivery lifecycle beyond a single delivery (DESIGN.md, "The delivery
//! lifecycle"), on every store:
//!
//! - drain: a handler whose sender went away finishes and commits during the drain; new
//!   deliveries are answered 503 with `Retry-After`; a deadline that comes first is reported
//!   with what was left and why; every mode (claim-then-commit, transactional, version guard)
//!   honours it;
//! - a duplicate that waits (`wait_in_flight`) for a first delivery in another instance (its
//!   own pool) is answered as a duplicate once the first committed, or runs the handler once
//!   the first released.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::{Semaphore, mpsc};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::body::{RequestBody, ResponseBody};
use tower_idempotency::store::{KeyState, Store};
use tower_idempotency::{Drain, IdempotencyKey, IdempotencyLayer, Outcome, Stage, key};

type Res = Response<ResponseBody<Full<Bytes>>>;

fn delivery(event: &str, behave: &str) -> Request<Full<Bytes>> {
    Request::post("/hook")
        .header("x-event-id", event)
        .header("x-behave", behave)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn outcome(res: &Res) -> Outcome {
    *res.extensions().get::<Outcome>().unwrap()
}

/// A handler that counts its runs and answers as `x-behave` says: `ok`, `slow` (300 ms),
/// `slow-500` (300 ms, then 500), `block` (announces itself on `started`, waits for a permit
/// of `gate`).
#[derive(Clone)]
struct Handler {
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    started: mpsc::UnboundedSender<()>,
}

impl Handler {
    fn new() -> (Self, mpsc::UnboundedReceiver<()>) {
        let (started, rx) = mpsc::unbounded_channel();
        let handler = Self {
            runs: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
            started,
        };
        (handler, rx)
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn service<St: Store + Clone>(
        &self,
        layer: IdempotencyLayer<St, key::Header>,
    ) -> impl Service<Request<Full<Bytes>>, Response = Res, Error = Infallible, Future = impl Send>
    + Clone
    + Send
    + 'static {
        let h = self.clone();
        layer.layer(service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
            let h = h.clone();
            async move {
                h.runs.fetch_add(1, Ordering::SeqCst);
                let behave = req.headers()["x-behave"].to_str().unwrap().to_owned();
                let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
                match behave.as_str() {
                    "slow" => tokio::time::sleep(Duration::from_millis(300)).await,
                    "slow-500" => {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    }
                    "block" => {
                        let _ = h.started.send(());
                        h.gate.acquire().await.unwrap().forget();
                    }
                    _ => {}
                }
                Ok(res)
            }
        }))
    }
}

fn layer<St>(store: St, ns: &str) -> IdempotencyLayer<St, key::Header> {
    IdempotencyLayer::new(store)
        .key(key::header("x-event-id").namespace(ns.to_owned()))
        .retry_after(Duration::from_secs(2))
}

async fn state<St: Store>(store: &St, ns: &str, id: &str) -> Option<KeyState> {
    let key = IdempotencyKey::new(ns.to_owned(), id).unwrap();
    store.describe(&key).await.unwrap().map(|r| r.state)
}

/// The sender of `evt_1` hangs up while its handler blocks; the process begins to shut down:
/// the drain turns a new delivery away with 503, waits for the handler, which commits, and
/// reports a clean drain. The drain is shared by two layers (two routes).
async fn drain_waits_for_a_detached_handler<St: Store + Clone>(store: St) {
    let ns = common::unique_namespace("drain");
    let drain = Drain::new();
    let (h, mut started) = Handler::new();
    let route_a = h.service(layer(store.clone(), &ns).drain(&drain));
    let route_b = h.service(layer(store.clone(), &format!("{ns}-b")).drain(&drain));

    let mut first = Box::pin(route_a.clone().oneshot(delivery("evt_1", "block")));
    tokio::select! {
        _ = &mut first => panic!("the handler blocks"),
        s = started.recv() => s.unwrap(),
    }
    drop(first); // the sender hung up
    assert_eq!(drain.in_flight(), 1);

    let shutdown = tokio::spawn({
        let drain = drain.clone();
        async move { drain.drain(Duration::from_secs(30)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(drain.is_closed());
    for route in [route_a.clone(), route_b] {
        let res = route.oneshot(delivery("evt_2", "ok")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(outcome(&res), Outcome::Draining);
        assert_eq!(res.headers()["retry-after"], "2");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
    }
    assert!(
        !shutdown.is_finished(),
        "the drain waits for the running handler"
    );

    h.gate.add_permits(1);
    let report = shutdown.await.unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(drain.in_flight(), 0);
    assert_eq!(state(&store, &ns, "evt_1").await, Some(KeyState::Done));
    assert_eq!(
        state(&store, &ns, "evt_2").await,
        None,
        "no claim while draining"
    );
    assert_eq!(h.runs(), 1);
}

/// A drain whose deadline passes reports the delivery it left, and why.
async fn drain_reports_what_it_left<St: Store + Clone>(store: St) {
    let ns = common::unique_namespace("drain-left");
    let (h, mut started) = Handler::new();
    let drain = Drain::new();
    let layer = layer(store.clone(), &ns).drain(&drain);
    let svc = h.service(layer);
    let running = tokio::spawn(svc.oneshot(delivery("evt_1", "block")));
    started.recv().await.unwrap();

    let report = drain.drain(Duration::from_millis(100)).await;
    assert!(!report.is_clean());
    assert_eq!(report.left.len(), 1, "{report}");
    assert_eq!(report.left[0].key.value(), "evt_1");
    assert_eq!(report.left[0].what, "claim");
    assert_eq!(report.left[0].stage, Stage::Running);
    assert!(report.waited >= Duration::from_millis(100));
    assert!(report.to_string().contains("still running"), "{report}");

    h.gate.add_permits(1);
    assert_eq!(running.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(drain.in_flight(), 0);
}

/// Two instances (two store handles, each with its own pool): the duplicate sent to the
/// second while the first runs waits, and is answered once the first settled: a duplicate if
/// it committed, a run of its own if it released.
async fn waiting_duplicate_across_instances<St: Store + Clone>(first: St, second: St) {
    for (behave, runs, answer) in [
        ("slow", 1, Outcome::Duplicate),
        ("slow-500", 2, Outcome::Processed),
    ] {
        let ns = common::unique_namespace("wait");
        let (h, _started) = Handler::new();
        let a = h.service(layer(first.clone(), &ns));
        let b = h.service(layer(second.clone(), &ns).wait_in_flight(Duration::from_secs(10)));
        let running = tokio::spawn(a.oneshot(delivery("evt_1", behave)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let waited = std::time::Instant::now();
        let res = b.oneshot(delivery("evt_1", "ok")).await.unwrap();
        let waited = waited.elapsed();
        assert_eq!(res.status(), StatusCode::OK, "{behave}");
        assert_eq!(outcome(&res), answer, "{behave}");
        assert!(
            waited >= Duration::from_millis(150),
            "it waited: {waited:?}"
        );
        running.await.unwrap().unwrap();
        assert_eq!(h.runs(), runs, "{behave}");
        assert_eq!(state(&first, &ns, "evt_1").await, Some(KeyState::Done));
    }
}

/// A waiting duplicate whose wait runs out gets the 409 it would have got at once.
async fn waiting_duplicate_gives_up_with_409<St: Store + Clone>(store: St) {
    let ns = common::unique_namespace("wait-409");
    let (h, mut started) = Handler::new();
    let svc = h.service(layer(store, &ns).wait_in_flight(Duration::from_millis(200)));
    let running = tokio::spawn(svc.clone().oneshot(delivery("evt_1", "block")));
    started.recv().await.unwrap();
    let res = svc.oneshot(delivery("evt_1", "ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(outcome(&res), Outcome::InFlight);
    h.gate.add_permits(1);
    running.await.unwrap().unwrap();
    assert_eq!(h.runs(), 1);
}

macro_rules! lifecycle_tests {
    ($module:ident, $feature:literal, $make:expr) => {
        #[cfg(feature = $feature)]
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drain_waits_for_a_detached_handler() {
                let Some(store) = $make else { return };
                super::drain_waits_for_a_detached_handler(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drain_reports_what_it_left() {
                let Some(store) = $make else { return };
                super::drain_reports_what_it_left(store).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn waiting_duplicate_across_instances() {
                let Some(first) = $make else { return };
                let Some(second) = $make else { return };
                super::waiting_duplicate_across_instances(first, second).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn waiting_duplicate_gives_up_with_409() {
                let Some(store) = $make else { return };
                super::waiting_duplicate_gives_up_with_409(store).await;
            }
        }
    };
}

/// One memory store for the binary: its clones share it, as instances share a database.
#[cfg(feature = "memory")]
fn memory_store() -> tower_idempotency::store::MemoryStore {
    static STORE: std::sync::OnceLock<tower_idempotency::store::MemoryStore> =
        std::sync::OnceLock::new();
    STORE.get_or_init(Default::default).clone()
}

lifecycle_tests!(memory, "memory", Some(memory_store()));
lifecycle_tests!(postgres, "postgres", common::db::postgres_store().await);
lifecycle_tests!(
    sqlite,
    "sqlite",
    common::db::sqlite_file_store("lifecycle").await
);
lifecycle_tests!(mysql, "mysql", common::db::mysql_store().await);

/// Transactional mode and the version guard answer 503 while their drain is closed, and the
/// drain waits for their open deliveries too.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_honours_the_drain() {
    use tower_idempotency::transactional::TransactionalLayer;
    use tower_idempotency::version_guard::{self, VersionGuardLayer};

    let store = common::db::sqlite_file_store("lifecycle").await.unwrap();
    let ns = common::unique_namespace("drain-modes");
    let drain = Drain::new();
    let ok = |_req: Request<RequestBody<Full<Bytes>>>| async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    };
    // The drain given before the setters that change the layer's type: it stays the layer's.
    let tx = TransactionalLayer::new(store.clone())
        .drain(&drain)
        .key(key::header("x-event-id").namespace(ns.clone()))
        .layer(service_fn(ok));
    let ordered = VersionGuardLayer::new(store.clone())
        .drain(&drain)
        .entity(key::header("x-entity").namespace(ns.clone()))
        .version(version_guard::version::header("x-version"))
        .layer(service_fn(ok));
    let entity = |version: &str| {
        Request::post("/")
            .header("x-entity", "sub_1")
            .header("x-version", version)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };

    let in_tx = tokio::spawn(tx.clone().oneshot(delivery("evt_1", "ok")));
    let in_order = tokio::spawn(ordered.clone().oneshot(entity("1")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(drain.in_flight(), 2);
    let shutdown = tokio::spawn({
        let drain = drain.clone();
        async move { drain.drain(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let res = tx.oneshot(delivery("evt_2", "ok")).await.unwrap();
    assert_eq!(
        (res.status(), outcome(&res)),
        (StatusCode::SERVICE_UNAVAILABLE, Outcome::Draining)
    );
    let res = ordered.oneshot(entity("2")).await.unwrap();
    assert_eq!(
        (res.status(), outcome(&res)),
        (StatusCode::SERVICE_UNAVAILABLE, Outcome::Draining)
    );

    assert!(shutdown.await.unwrap().is_clean());
    assert_eq!(outcome(&in_tx.await.unwrap().unwrap()), Outcome::Processed);
    assert_eq!(
        outcome(&in_order.await.unwrap().unwrap()),
        Outcome::Processed
    );
}
