//! Every row of the status table, driven through the layer with `MemoryStore` (and stores
//! that fail on purpose).

mod common;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tokio::sync::{Semaphore, mpsc};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::body::{RequestBody, ResponseBody};
use tower_idempotency::store::{
    Claim, KeyRecord, KeyState, Lease, MemoryStore, Resolution, Stale, Store, StoreError,
    StuckClaim,
};
use tower_idempotency::{Drain, IdempotencyKey, IdempotencyLayer, MissingKey, Outcome, key};

use common::problem;

type Req = Request<RequestBody<Full<Bytes>>>;
type Res = Response<ResponseBody<Full<Bytes>>>;

/// A webhook handler whose behaviour each request picks with `x-behave`: `ok`, `500`, `err`,
/// `panic`, `block` (wait for a permit of `gate`, after announcing itself on `started`), or
/// `block-500` (the same, then answer 500). It counts its runs, and its finishes in `done`.
#[derive(Clone)]
struct Handler {
    runs: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    started: mpsc::UnboundedSender<()>,
}

struct Harness {
    runs: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    started: mpsc::UnboundedReceiver<()>,
    handler: Handler,
}

impl Harness {
    fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let runs = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Semaphore::new(0));
        Self {
            runs: runs.clone(),
            done: done.clone(),
            gate: gate.clone(),
            started: rx,
            handler: Handler {
                runs,
                done,
                gate,
                started: tx,
            },
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn finished(&self) -> usize {
        self.done.load(Ordering::SeqCst)
    }

    fn service<St: Store + Clone, K: key::ExtractKey + Clone>(
        &self,
        layer: IdempotencyLayer<St, K>,
    ) -> impl Service<Request<Full<Bytes>>, Response = Res, Error = &'static str, Future = impl Send>
    + Clone
    + Send
    + 'static {
        let handler = self.handler.clone();
        layer.layer(service_fn(move |req: Req| {
            let h = handler.clone();
            async move {
                h.runs.fetch_add(1, Ordering::SeqCst);
                let behave = req
                    .headers()
                    .get("x-behave")
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_else(|| "ok".into());
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let failed = || {
                    let mut res = Response::new(Full::new(Bytes::from_static(b"boom")));
                    *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    res
                };
                let answer = match behave.as_str() {
                    "500" => Ok(failed()),
                    "err" => Err("handler error"),
                    "panic" => panic!("handler panicked"),
                    "block" | "block-500" => {
                        let _ = h.started.send(());
                        h.gate.acquire().await.unwrap().forget();
                        if behave == "block" {
                            Ok(Response::new(Full::new(body)))
                        } else {
                            Ok(failed())
                        }
                    }
                    _ => Ok(Response::new(Full::new(body))),
                };
                h.done.fetch_add(1, Ordering::SeqCst);
                answer
            }
        }))
    }
}

fn delivery(id: &str, behave: &str) -> Request<Full<Bytes>> {
    Request::post("/hook")
        .header("x-event-id", id)
        .header("x-behave", behave)
        .body(Full::new(Bytes::from_static(b"payload")))
        .unwrap()
}

fn layer(store: MemoryStore) -> IdempotencyLayer<MemoryStore, key::Header> {
    IdempotencyLayer::new(store).key(key::header("x-event-id").namespace("test"))
}

/// The key the layer stores for a delivery of `id` to `/hook`: the route's path is its scope.
fn test_key(id: &str) -> IdempotencyKey {
    IdempotencyKey::new("test", id).unwrap()
}

async fn body_text(res: Res) -> String {
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

async fn record(store: &impl Store, id: &str) -> KeyRecord {
    store
        .describe(&test_key(id))
        .await
        .unwrap()
        .expect("the key is known")
}

#[tokio::test]
async fn first_delivery_runs_and_commits_then_duplicates_get_200() {
    let h = Harness::new();
    let store = MemoryStore::new();
    let svc = h.service(layer(store.clone()));

    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert!(
        res.headers().get("idempotency-outcome").is_none(),
        "the handler's response is untouched"
    );
    assert_eq!(
        res.extensions().get::<IdempotencyKey>(),
        Some(&test_key("e1"))
    );
    assert_eq!(body_text(res).await, "payload");

    for _ in 0..3 {
        let dup = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
        assert_eq!(
            dup.status(),
            StatusCode::OK,
            "never 409 for a finished event"
        );
        assert_eq!(dup.headers()["idempotency-outcome"], "duplicate");
        assert_eq!(dup.extensions().get::<Outcome>(), Some(&Outcome::Duplicate));
        assert_eq!(
            dup.extensions().get::<IdempotencyKey>(),
            Some(&test_key("e1"))
        );
        assert_eq!(body_text(dup).await, "");
    }
    assert_eq!(h.runs(), 1);
    match store
        .claim(&test_key("e1"), Stale::default())
        .await
        .unwrap()
    {
        Claim::Done(done) => assert_eq!(done.deliveries, 5),
        other => panic!("expected done, got {other:?}"),
    }
    let journal = record(&store, "e1").await;
    assert_eq!(journal.state, KeyState::Done);
    assert_eq!((journal.deliveries, journal.runs), (5, 1));
}

#[tokio::test]
async fn non_success_releases_and_the_retry_runs() {
    let h = Harness::new();
    let store = MemoryStore::new();
    let svc = h.service(layer(store.clone()));

    let res = svc.clone().oneshot(delivery("e1", "500")).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Released));
    assert_eq!(record(&store, "e1").await.state, KeyState::Released);

    let retry = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(
        retry.extensions().get::<Outcome>(),
        Some(&Outcome::Processed)
    );
    assert_eq!(
        h.runs(),
        2,
        "the handler that failed once ran again on retry"
    );
    let dup = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(dup.headers()["idempotency-outcome"], "duplicate");
    assert_eq!(h.runs(), 2);
    let journal = record(&store, "e1").await;
    assert_eq!(
        (journal.deliveries, journal.runs),
        (3, 2),
        "the failed run is counted"
    );
}

#[tokio::test]
async fn inner_error_is_returned_and_releases() {
    let h = Harness::new();
    let store = MemoryStore::new();
    let svc = h.service(layer(store.clone()));

    let err = svc
        .clone()
        .oneshot(delivery("e1", "err"))
        .await
        .unwrap_err();
    assert_eq!(
        err, "handler error",
        "the inner error type and value are kept"
    );
    assert_eq!(record(&store, "e1").await.state, KeyState::Released);
    svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(h.runs(), 2);
}

#[tokio::test]
async fn commit_when_decides_what_counts_as_success() {
    let h = Harness::new();
    let store = MemoryStore::new();
    let svc =
        h.service(layer(store.clone()).commit_when(|s| s.is_success() || s.is_server_error()));
    let res = svc.clone().oneshot(delivery("e1", "500")).await.unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    let dup = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(dup.headers()["idempotency-outcome"], "duplicate");
    assert_eq!(h.runs(), 1);
}

async fn panicking_delivery(h: &Harness, store: MemoryStore, stale: Stale) {
    let svc = h.service(layer(store).stale(stale));
    let join = tokio::spawn(svc.oneshot(delivery("e1", "panic"))).await;
    assert!(
        join.unwrap_err().is_panic(),
        "the panic goes on to the caller"
    );
}

#[tokio::test]
async fn panic_releases_under_reclaim() {
    let h = Harness::new();
    let store = MemoryStore::new();
    panicking_delivery(&h, store.clone(), Stale::default()).await;
    assert_eq!(record(&store, "e1").await.state, KeyState::Released);
    let svc = h.service(layer(store));
    let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(h.runs(), 2, "the retry ran");
}

#[tokio::test(start_paused = true)]
async fn panic_is_held_under_hold_until_resolved() {
    let h = Harness::new();
    let store = MemoryStore::new();
    let hold = Stale::hold_after(Duration::from_secs(60));
    panicking_delivery(&h, store.clone(), hold).await;
    let svc = h.service(layer(store.clone()).stale(hold));

    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::CONFLICT,
        "not stale yet: in flight"
    );
    tokio::time::advance(Duration::from_secs(61)).await;
    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(res.headers()["idempotency-outcome"], "held");
    assert_eq!(h.runs(), 1, "the retry did not run");

    let stuck = store.stuck_claims(Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        stuck.iter().map(|s| &s.key).collect::<Vec<_>>(),
        [&test_key("e1")]
    );
    assert!(
        store
            .resolve(&test_key("e1"), Resolution::Release)
            .await
            .unwrap()
    );
    let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(h.runs(), 2, "after the person released it, the retry ran");
}

/// Starts a delivery whose handler blocks, waits until the handler runs, and drops the
/// response future, as hyper does when the client disconnects.
async fn dropped_delivery(h: &mut Harness, store: MemoryStore, stale: Stale) {
    let svc = h.service(layer(store).stale(stale));
    let mut fut = Box::pin(svc.oneshot(delivery("e1", "block")));
    tokio::select! {
        _ = &mut fut => panic!("the handler should block"),
        started = h.started.recv() => started.unwrap(),
    }
    drop(fut);
}

async fn eventually(mut check: impl FnMut() -> bool) {
    for _ in 0..400 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("condition not reached");
}

/// A delivery whose sender went away keeps its claim while the handler runs on, and commits
/// when it finishes: the retry is 409 meanwhile and a duplicate after. Under either policy.
#[tokio::test]
async fn dropped_future_runs_on_to_completion() {
    for stale in [Stale::default(), Stale::hold_after(Duration::from_secs(60))] {
        let mut h = Harness::new();
        let store = MemoryStore::new();
        dropped_delivery(&mut h, store.clone(), stale).await;
        let svc = h.service(layer(store.clone()).stale(stale));
        let retry = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
        assert_eq!(
            retry.headers()["idempotency-outcome"],
            "in-flight",
            "{stale:?}"
        );
        assert_eq!(h.finished(), 0, "the handler still runs");

        h.gate.add_permits(1);
        eventually(|| h.finished() == 1).await;
        let journal = store.clone();
        for _ in 0..200 {
            if record(&journal, "e1").await.state == KeyState::Done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let retry = svc.oneshot(delivery("e1", "ok")).await.unwrap();
        assert_eq!(
            retry.headers()["idempotency-outcome"],
            "duplicate",
            "{stale:?}"
        );
        assert_eq!(
            (h.runs(), h.finished()),
            (1, 1),
            "started once, finished once"
        );
        assert!(store.stuck_claims(Duration::ZERO).await.unwrap().is_empty());
    }
}

/// A handler that runs three times the stale limit keeps its claim: the heartbeat renews it.
#[tokio::test(start_paused = true)]
async fn long_handler_is_never_reclaimed() {
    let mut h = Harness::new();
    let store = MemoryStore::new();
    let stale = Stale::reclaim_after(Duration::from_secs(10));
    let svc = h.service(layer(store.clone()).stale(stale));
    let first = tokio::spawn(svc.clone().oneshot(delivery("e1", "block")));
    h.started.recv().await.unwrap();
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let retry = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
        assert_eq!(retry.headers()["idempotency-outcome"], "in-flight");
    }
    let journal = record(&store, "e1").await;
    assert!(journal.claimed_ago >= Duration::from_secs(30));
    assert!(journal.renewed_ago.unwrap() <= stale.renew_interval());
    h.gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(h.runs(), 1, "30 retries over 3 stale limits, no second run");
}

/// A handler shorter than the renew interval never renews.
#[tokio::test(start_paused = true)]
async fn short_handler_pays_no_renewal() {
    let mut h = Harness::new();
    let store = Faulty::default();
    let svc = h.service(
        IdempotencyLayer::new(store.clone())
            .key(key::header("x-event-id").namespace("test"))
            .stale(Stale::reclaim_after(Duration::from_secs(40))),
    );
    let first = tokio::spawn(svc.clone().oneshot(delivery("e1", "block")));
    h.started.recv().await.unwrap();
    tokio::time::sleep(Duration::from_secs(9)).await;
    h.gate.add_permits(1);
    first.await.unwrap().unwrap();
    assert_eq!(store.renewals.load(Ordering::SeqCst), 0);

    let second = tokio::spawn(svc.oneshot(delivery("e2", "block")));
    h.started.recv().await.unwrap();
    tokio::time::sleep(Duration::from_secs(25)).await;
    h.gate.add_permits(1);
    second.await.unwrap().unwrap();
    assert_eq!(store.renewals.load(Ordering::SeqCst), 2, "every 10 s");
}

/// Durations too long for an instant mean "never", not a panic: a `Retry-After`, a stale
/// limit (and so a heartbeat interval), a wait for the first delivery and a drain deadline of
/// `Duration::MAX`.
#[tokio::test]
async fn huge_durations_do_not_overflow() {
    let mut h = Harness::new();
    let store = MemoryStore::new();
    let drain = Drain::new();
    let configured = layer(store)
        .retry_after(Duration::MAX)
        .stale(Stale::hold_after(Duration::MAX))
        .drain(&drain);
    let svc = h.service(configured.clone());
    let first = tokio::spawn(svc.clone().oneshot(delivery("e1", "block")));
    h.started.recv().await.unwrap();
    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(res.headers()["retry-after"], u64::MAX.to_string());

    let waiting = h.service(configured.wait_in_flight(Duration::MAX));
    let second = tokio::spawn(waiting.oneshot(delivery("e1", "ok")));
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    let second = second.await.unwrap().unwrap();
    assert_eq!(second.headers()["idempotency-outcome"], "duplicate");
    let report = drain.drain(Duration::MAX).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(h.runs(), 1);
}

/// The drain given to a layer is the one it uses, whether it was given first (before the
/// setter that changes the key's type) or last: the handle kept for the shutdown counts the
/// deliveries of both layers, turns new ones away and waits for the running ones.
#[tokio::test]
async fn the_drain_given_first_or_last_drains_the_layer() {
    let mut h = Harness::new();
    let store = MemoryStore::new();
    let drain = Drain::new();
    let given_first = IdempotencyLayer::new(store.clone())
        .drain(&drain)
        .key(key::header("x-event-id").namespace("first"));
    let given_last = layer(store)
        .retry_after(Duration::from_secs(2))
        .drain(&drain);
    let first = h.service(given_first);
    let last = h.service(given_last);

    let running = [
        tokio::spawn(first.clone().oneshot(delivery("e1", "block"))),
        tokio::spawn(last.clone().oneshot(delivery("e1", "block"))),
    ];
    h.started.recv().await.unwrap();
    h.started.recv().await.unwrap();
    assert_eq!(drain.in_flight(), 2, "both layers' deliveries are tracked");

    let shutdown = tokio::spawn({
        let drain = drain.clone();
        async move { drain.drain(Duration::from_secs(30)).await }
    });
    eventually(|| drain.is_closed()).await;
    for svc in [first.clone(), last.clone()] {
        let res = svc.oneshot(delivery("e2", "ok")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Draining));
    }
    assert!(!shutdown.is_finished(), "the drain waits for both handlers");

    h.gate.add_permits(2);
    for res in running {
        assert_eq!(res.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let report = shutdown.await.unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(drain.in_flight(), 0);
    assert_eq!(h.runs(), 2);
}

#[tokio::test]
async fn in_flight_duplicate_gets_409_with_retry_after() {
    let mut h = Harness::new();
    let store = MemoryStore::new();
    let svc = h.service(layer(store).retry_after(Duration::from_millis(1500)));
    let first = tokio::spawn(svc.clone().oneshot(delivery("e1", "block")));
    h.started.recv().await.unwrap();

    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(
        res.headers()["retry-after"],
        "2",
        "rounded up to whole seconds"
    );
    assert_eq!(res.headers()["idempotency-outcome"], "in-flight");
    assert_eq!(problem(res).await["status"], 409);

    h.gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    let dup = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(dup.headers()["idempotency-outcome"], "duplicate");
    assert_eq!(h.runs(), 1);
}

/// A layer over `store` whose renewals fail: an owner cut off from the store.
fn unrenewed(store: &Faulty, stale: Stale) -> IdempotencyLayer<Faulty, key::Header> {
    store.fail_renew.store(true, Ordering::SeqCst);
    IdempotencyLayer::new(store.clone())
        .key(key::header("x-event-id").namespace("test"))
        .stale(stale)
}

#[tokio::test(start_paused = true)]
async fn reclaimed_owner_is_fenced_off() {
    let mut h = Harness::new();
    let store = Faulty::default();
    let stale = Stale::reclaim_after(Duration::from_secs(60));
    let journal = tower_idempotency::Journal::new(16);
    let svc = h.service(unrenewed(&store, stale).journal(&journal));

    // The first owner blocks and cannot renew past the stale limit...
    let old = tokio::spawn(svc.clone().oneshot(delivery("e1", "block")));
    h.started.recv().await.unwrap();
    tokio::time::sleep(Duration::from_secs(61)).await;
    // ...so a retry reclaims the key and starts running too.
    let new = tokio::spawn(svc.clone().oneshot(delivery("e1", "block")));
    h.started.recv().await.unwrap();
    assert_eq!(h.runs(), 2, "the stale claim was reclaimed");

    // The old owner finishes first: its commit is fenced off, the key stays in flight.
    h.gate.add_permits(1);
    let old_res = old.await.unwrap().unwrap();
    assert_eq!(old_res.status(), StatusCode::OK, "its response stands");
    // Its outcome, and so the journal, the span and the metrics, says the lease was lost,
    // not that the event was processed.
    assert_eq!(
        old_res.extensions().get::<Outcome>(),
        Some(&Outcome::LeaseLost)
    );
    let seen = journal.last(&test_key("e1")).expect("journaled");
    assert_eq!(seen.outcome, Outcome::LeaseLost);
    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(
        res.headers()["idempotency-outcome"],
        "in-flight",
        "the old owner's late commit did not mark the new owner's claim done"
    );

    h.gate.add_permits(1);
    let new_res = new.await.unwrap().unwrap();
    assert_eq!(new_res.status(), StatusCode::OK);
    assert_eq!(
        new_res.extensions().get::<Outcome>(),
        Some(&Outcome::Processed)
    );
    assert_eq!(
        journal.last(&test_key("e1")).unwrap().outcome,
        Outcome::Processed
    );
    let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.headers()["idempotency-outcome"], "duplicate");
    assert_eq!(h.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn held_claim_answers_409_and_calls_the_hook() {
    let mut h = Harness::new();
    let store = Faulty::default();
    let alerts = Arc::new(AtomicUsize::new(0));
    let seen = alerts.clone();
    let hold = unrenewed(&store, Stale::hold_after(Duration::from_secs(60))).on_held(
        move |key, pending| {
            assert_eq!(key.value(), "e1");
            assert!(pending.since_renewal >= Duration::from_secs(60));
            seen.fetch_add(1, Ordering::SeqCst);
        },
    );
    let svc = h.service(hold);
    let _owner = tokio::spawn(svc.clone().oneshot(delivery("e1", "block")));
    h.started.recv().await.unwrap();
    tokio::time::sleep(Duration::from_secs(61)).await;

    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Held));
    assert!(res.headers().get("retry-after").is_none());
    assert_eq!(alerts.load(Ordering::SeqCst), 1);
    assert_eq!(h.runs(), 1);
    let stuck: Vec<StuckClaim> = store.stuck_claims(Duration::from_secs(60)).await.unwrap();
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].deliveries, 2);
}

#[tokio::test]
async fn missing_key_is_400_naming_the_expected_key() {
    let h = Harness::new();
    let svc = h.service(layer(MemoryStore::new()));
    let req = Request::post("/hook")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Rejected));
    let body = problem(res).await;
    assert_eq!(body["status"], 400);
    assert_eq!(body["expected"], "header `x-event-id`");
    assert_eq!(h.runs(), 0);
}

#[tokio::test]
async fn missing_key_can_pass_through() {
    let h = Harness::new();
    let store = MemoryStore::new();
    let svc = h.service(layer(store.clone()).missing_key(MissingKey::PassThrough));
    for _ in 0..2 {
        let req = Request::post("/hook")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(
            res.extensions().get::<Outcome>(),
            Some(&Outcome::PassedThrough)
        );
    }
    assert_eq!(h.runs(), 2, "unguarded requests run every time");
    assert!(store.is_empty());
    // A key that is present but invalid is still rejected.
    let req = Request::post("/hook")
        .header("x-event-id", " ")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(
        svc.oneshot(req).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
}

/// A longest key above what the stores keep is a configuration mistake, refused when the
/// layer is built rather than quietly lowered; the maximum itself is accepted.
#[test]
#[should_panic(expected = "max_key_len(256) is above the longest key a store keeps")]
fn max_key_len_above_the_maximum_panics() {
    let accepted = layer(MemoryStore::new()).max_key_len(key::MAX_KEY_LEN);
    let _ = accepted.max_key_len(key::MAX_KEY_LEN + 1);
}

#[tokio::test]
async fn invalid_keys_are_400() {
    let h = Harness::new();
    let svc = h.service(layer(MemoryStore::new()).max_key_len(16));
    let mut non_utf8 = delivery("x", "ok");
    non_utf8.headers_mut().insert(
        "x-event-id",
        http::HeaderValue::from_bytes(b"\xfe\xff").unwrap(),
    );
    let cases = [
        delivery("", "ok"),
        delivery("   ", "ok"),
        delivery(&"k".repeat(17), "ok"),
        delivery(&"k".repeat(10 * 1024), "ok"),
        delivery("a\tb", "ok"),
        non_utf8,
    ];
    for req in cases {
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
        let body = problem(res).await;
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("invalid idempotency key"),
            "{body}"
        );
    }
    assert_eq!(h.runs(), 0);
}

fn stripe_event(body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/stripe")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

#[tokio::test]
async fn body_key_errors() {
    let h = Harness::new();
    let svc = h.service(
        IdempotencyLayer::new(MemoryStore::new())
            .key(key::stripe())
            .body_limit(64),
    );
    let cases = [
        ("not json", StatusCode::BAD_REQUEST, "not valid JSON"),
        (
            r#"{"type":"charge.succeeded"}"#,
            StatusCode::BAD_REQUEST,
            "JSON field `/id`",
        ),
        (
            r#"{"id":{"nested":1}}"#,
            StatusCode::BAD_REQUEST,
            "is an object",
        ),
        (r#"{"id":[1,2]}"#, StatusCode::BAD_REQUEST, "is an array"),
        (
            r#"{"id":"evt_1","padding":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#,
            StatusCode::PAYLOAD_TOO_LARGE,
            "limit of 64 bytes",
        ),
    ];
    for (body, status, detail) in cases {
        let res = svc.clone().oneshot(stripe_event(body)).await.unwrap();
        assert_eq!(res.status(), status, "{body}");
        let problem = problem(res).await;
        assert!(
            problem["detail"].as_str().unwrap().contains(detail),
            "{problem}"
        );
    }
    assert_eq!(h.runs(), 0);
    // An integer id is a valid key.
    let res = svc.oneshot(stripe_event(r#"{"id":12345}"#)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(h.runs(), 1);
}

/// A streaming body with no declared length, delivered in chunks.
struct Chunks(std::vec::IntoIter<&'static [u8]>);

fn chunks(parts: Vec<&'static [u8]>) -> Chunks {
    Chunks(parts.into_iter())
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(
            self.0
                .next()
                .map(|c| Ok(Frame::data(Bytes::from_static(c)))),
        )
    }
}

#[tokio::test]
async fn streamed_body_over_the_limit_is_413_and_under_it_arrives_intact() {
    let echo = service_fn(|req: Request<RequestBody<Chunks>>| async move {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        Ok::<_, Infallible>(Response::new(Full::new(body)))
    });
    let svc = IdempotencyLayer::new(MemoryStore::new())
        .key(key::stripe())
        .body_limit(32)
        .layer(echo);

    let ok = Request::new(chunks(vec![b"{\"id\":", b"\"evt_1\",", b"\"a\":1}"]));
    let res = svc.clone().oneshot(ok).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let echoed = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(echoed, "{\"id\":\"evt_1\",\"a\":1}");

    let big = Request::new(chunks(vec![b"{\"id\":\"evt_2\",", &[b' '; 40], b"}"]));
    let res = svc.oneshot(big).await.unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn declared_length_over_the_limit_is_413_without_reading() {
    let h = Harness::new();
    let svc = h.service(
        IdempotencyLayer::new(MemoryStore::new())
            .key(key::stripe())
            .body_limit(1024),
    );
    let req = Request::post("/")
        .header("content-length", "67108864")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    assert_eq!(
        svc.oneshot(req).await.unwrap().status(),
        StatusCode::PAYLOAD_TOO_LARGE
    );
}

/// A body that never ends.
struct Endless;

impl Body for Endless {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Pending
    }
}

#[tokio::test(start_paused = true)]
async fn body_that_never_ends_times_out_with_408() {
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = runs.clone();
    let svc = IdempotencyLayer::new(MemoryStore::new())
        .key(key::stripe())
        .body_timeout(Duration::from_secs(10))
        .layer(service_fn(move |_req: Request<RequestBody<Endless>>| {
            seen.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
        }));
    let res = svc.oneshot(Request::new(Endless)).await.unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(res.headers()["connection"], "close");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A body that records whether anyone polled it.
struct Watched(Arc<AtomicBool>);

impl Body for Watched {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.store(true, Ordering::SeqCst);
        Poll::Ready(None)
    }
}

#[tokio::test]
async fn header_keys_never_touch_the_body() {
    let polled = Arc::new(AtomicBool::new(false));
    let svc = layer(MemoryStore::new()).layer(service_fn(
        |req: Request<RequestBody<Watched>>| async move {
            assert_eq!(
                format!("{:?}", req.body()),
                "RequestBody { kind: \"inner\" }"
            );
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        },
    ));
    let req = Request::post("/")
        .header("x-event-id", "e1")
        .body(Watched(polled.clone()))
        .unwrap();
    assert_eq!(svc.oneshot(req).await.unwrap().status(), StatusCode::OK);
    assert!(
        !polled.load(Ordering::SeqCst),
        "the layer did not read the body"
    );
}

#[tokio::test]
async fn same_event_twice_in_a_row_runs_once() {
    let h = Harness::new();
    let svc = h.service(layer(MemoryStore::new()));
    let a = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    let b = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    assert_eq!(h.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_event_from_64_tasks_runs_once() {
    let h = Harness::new();
    let svc = h.service(layer(MemoryStore::new()));
    let tasks: Vec<_> = (0..64)
        .map(|_| tokio::spawn(svc.clone().oneshot(delivery("e1", "ok"))))
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap().unwrap().status());
    }
    assert!(
        answers
            .iter()
            .all(|s| *s == StatusCode::OK || *s == StatusCode::CONFLICT),
        "{answers:?}"
    );
    assert_eq!(h.runs(), 1);
}

/// A store that fails or dawdles on purpose, around a working one.
#[derive(Clone, Default)]
struct Faulty {
    inner: MemoryStore,
    fail_claim: Arc<AtomicBool>,
    fail_commit: Arc<AtomicBool>,
    fail_renew: Arc<AtomicBool>,
    /// Releases and give-backs fail while set; each attempt is counted.
    fail_release: Arc<AtomicBool>,
    releases: Arc<AtomicUsize>,
    renewals: Arc<AtomicUsize>,
    /// How long each claim takes, like a database round trip.
    claim_delay: Duration,
    /// When set, each claim waits for a permit before it asks the inner store.
    claim_gate: Option<Arc<Semaphore>>,
}

fn outage() -> StoreError {
    StoreError::backend(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "connection refused",
    ))
}

impl Store for Faulty {
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        if !self.claim_delay.is_zero() {
            tokio::time::sleep(self.claim_delay).await;
        }
        if let Some(gate) = &self.claim_gate {
            gate.acquire().await.unwrap().forget();
        }
        if self.fail_claim.load(Ordering::SeqCst) {
            return Err(outage());
        }
        self.inner.claim(key, stale).await
    }
    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        if self.fail_renew.load(Ordering::SeqCst) {
            return Err(outage());
        }
        self.inner.renew(lease).await
    }
    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        if self.fail_commit.load(Ordering::SeqCst) {
            return Err(outage());
        }
        self.inner.commit(lease).await
    }
    async fn commit_with(
        &self,
        lease: &Lease,
        receipt: &tower_idempotency::store::Receipt,
    ) -> Result<(), StoreError> {
        if self.fail_commit.load(Ordering::SeqCst) {
            return Err(outage());
        }
        self.inner.commit_with(lease, receipt).await
    }
    fn describe(
        &self,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Option<KeyRecord>, StoreError>> + Send {
        self.inner.describe(key)
    }
    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        if self.fail_release.load(Ordering::SeqCst) {
            return Err(outage());
        }
        self.inner.release(lease).await
    }
    async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        if self.fail_release.load(Ordering::SeqCst) {
            return Err(outage());
        }
        self.inner.give_back(lease).await
    }
    fn stuck_claims(
        &self,
        older_than: Duration,
    ) -> impl Future<Output = Result<Vec<StuckClaim>, StoreError>> + Send {
        self.inner.stuck_claims(older_than)
    }
    fn resolve(
        &self,
        key: &IdempotencyKey,
        r: Resolution,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.inner.resolve(key, r)
    }
    fn purge_completed(
        &self,
        older_than: Duration,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        self.inner.purge_completed(older_than)
    }
}

#[tokio::test]
async fn store_failure_is_503_and_the_handler_does_not_run() {
    let h = Harness::new();
    let store = Faulty::default();
    store.fail_claim.store(true, Ordering::SeqCst);
    let svc = h.service(
        IdempotencyLayer::new(store.clone())
            .key(key::header("x-event-id").namespace("test"))
            .retry_after(Duration::from_secs(7)),
    );
    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "7");
    assert_eq!(
        res.extensions().get::<Outcome>(),
        Some(&Outcome::StoreUnavailable)
    );
    assert_eq!(h.runs(), 0, "never run without a claim");

    // The store comes back: the sender's retry is processed, once.
    store.fail_claim.store(false, Ordering::SeqCst);
    svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(h.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn failed_commit_keeps_the_response_and_is_retried() {
    let h = Harness::new();
    let store = Faulty::default();
    store.fail_commit.store(true, Ordering::SeqCst);
    let svc = h.service(
        IdempotencyLayer::new(store.clone()).key(key::header("x-event-id").namespace("test")),
    );
    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "the work is done; its response stands"
    );
    assert_eq!(body_text(res).await, "payload");
    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(
        res.headers()["idempotency-outcome"],
        "in-flight",
        "the commit is retried meanwhile"
    );
    // The store comes back within a few seconds: the background retry lands.
    tokio::time::sleep(Duration::from_secs(3)).await;
    store.fail_commit.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.headers()["idempotency-outcome"], "duplicate");
    assert_eq!(h.runs(), 1);
    assert_eq!(record(&store, "e1").await.state, KeyState::Done);
}

#[tokio::test]
async fn auto_keys_by_provider() {
    let h = Harness::new();
    let svc = h.service(IdempotencyLayer::new(MemoryStore::new()));
    let send = |name: &str, value: &str| {
        Request::post("/")
            .header(name, value)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    // The same id from two senders is two events.
    svc.clone()
        .oneshot(send("x-github-delivery", "same"))
        .await
        .unwrap();
    svc.clone()
        .oneshot(send("x-shopify-webhook-id", "same"))
        .await
        .unwrap();
    svc.clone()
        .oneshot(send("x-github-delivery", "same"))
        .await
        .unwrap();
    assert_eq!(h.runs(), 2);
    let stripe = Request::post("/")
        .header("stripe-signature", "t=1,v1=x")
        .body(Full::new(Bytes::from_static(br#"{"id":"same"}"#)))
        .unwrap();
    svc.oneshot(stripe).await.unwrap();
    assert_eq!(h.runs(), 3);
}

#[tokio::test]
async fn delivery_dropped_during_its_claim_leaves_no_claim_behind() {
    let h = Harness::new();
    let store = Faulty {
        claim_delay: Duration::from_millis(100),
        ..Faulty::default()
    };
    let svc = h.service(
        IdempotencyLayer::new(store.clone()).key(key::header("x-event-id").namespace("test")),
    );
    // The client goes away while the claim is on its way to the store.
    let dropped = tokio::time::timeout(
        Duration::from_millis(20),
        svc.clone().oneshot(delivery("e1", "ok")),
    )
    .await;
    assert!(dropped.is_err());
    // The claim lands, finds nobody waiting for it, and is given back.
    tokio::time::sleep(Duration::from_millis(150)).await;
    given_back(&store, "e1").await;
    assert_eq!(h.runs(), 0);
    let record = store.describe(&test_key("e1")).await.unwrap().unwrap();
    assert_eq!(record.runs, 0, "no handler ran, so the store counts no run");
    let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(h.runs(), 1);
}

#[tokio::test]
async fn store_that_does_not_answer_in_time_is_503() {
    let h = Harness::new();
    let store = Faulty {
        claim_delay: Duration::from_millis(200),
        ..Faulty::default()
    };
    let svc = h.service(
        IdempotencyLayer::new(store.clone())
            .key(key::header("x-event-id").namespace("test"))
            .store_timeout(Duration::from_millis(20)),
    );
    let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(h.runs(), 0);
    // The late claim is given back, so the sender's retry is not stuck behind it.
    tokio::time::sleep(Duration::from_millis(250)).await;
    given_back(&store, "e1").await;
}

/// The store is slow and failing: the claim lands after the delivery stopped waiting, and the
/// first attempts to give it back fail. It is tried again until it lands, and the store
/// counts no run, so that nothing is left `processing` (and, under hold, held for a person)
/// with a run no handler made.
#[tokio::test]
async fn a_give_back_that_fails_is_tried_again_until_it_lands() {
    let h = Harness::new();
    let store = Faulty {
        claim_delay: Duration::from_millis(100),
        ..Faulty::default()
    };
    store.fail_release.store(true, Ordering::SeqCst);
    let svc = h.service(
        IdempotencyLayer::new(store.clone())
            .key(key::header("x-event-id").namespace("test"))
            .stale(Stale::hold_after(Duration::from_secs(30)))
            .store_timeout(Duration::from_millis(20)),
    );
    let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The claim lands at 100 ms and its give-back fails, once and again.
    while store.releases.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let record = store.describe(&test_key("e1")).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        KeyState::Processing,
        "nothing was given back yet"
    );
    store.fail_release.store(false, Ordering::SeqCst);
    given_back(&store, "e1").await;
    let record = store.describe(&test_key("e1")).await.unwrap().unwrap();
    assert_eq!(record.runs, 0, "no handler ran");
    assert_eq!(h.runs(), 0);
    // The sender's retry, to a store that answers in time again, runs the handler.
    let patient = h.service(
        IdempotencyLayer::new(store.clone())
            .key(key::header("x-event-id").namespace("test"))
            .stale(Stale::hold_after(Duration::from_secs(30))),
    );
    let res = patient.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(h.runs(), 1);
    let record = store.describe(&test_key("e1")).await.unwrap().unwrap();
    assert_eq!(record.runs, 1);
}

/// The delivery goes away while the store is granting its claim (the store's answer is on its
/// way, and nobody will poll the delivery again): the claim finishes in a task of its own and
/// is given back, not left `processing` with no handler. Deterministic: one thread, the
/// delivery polled once and dropped.
#[tokio::test(flavor = "current_thread")]
async fn claim_answered_as_the_delivery_goes_away_is_given_back() {
    let h = Harness::new();
    let gate = Arc::new(Semaphore::new(0));
    let store = Faulty {
        claim_gate: Some(gate.clone()),
        ..Faulty::default()
    };
    let svc = h.service(
        IdempotencyLayer::new(store.clone()).key(key::header("x-event-id").namespace("test")),
    );
    let mut delivery = Box::pin(svc.clone().oneshot(delivery("e1", "ok")));
    // First poll: the claim waits on the gate.
    std::future::poll_fn(|cx| {
        assert!(delivery.as_mut().poll(cx).is_pending());
        Poll::Ready(())
    })
    .await;
    // The store may answer now; the delivery is never polled again.
    gate.add_permits(1);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    drop(delivery);
    given_back(&store, "e1").await;
    assert_eq!(h.runs(), 0);
    gate.add_permits(1);
    let res = svc.oneshot(self::delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
}

/// Waits until the claim on `id` has been released.
async fn given_back(store: &Faulty, id: &str) {
    for _ in 0..400 {
        let journal = store.describe(&test_key(id)).await.unwrap();
        if journal.is_some_and(|j| j.state == KeyState::Released) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the claim on {id} was never given back");
}

#[tokio::test(start_paused = true)]
async fn reclaimed_owner_that_fails_leaves_the_new_claim_alone() {
    let mut h = Harness::new();
    let store = Faulty::default();
    let svc = h.service(unrenewed(
        &store,
        Stale::reclaim_after(Duration::from_secs(60)),
    ));
    let old = tokio::spawn(svc.clone().oneshot(delivery("e1", "block-500")));
    h.started.recv().await.unwrap();
    tokio::time::sleep(Duration::from_secs(61)).await;
    let new = tokio::spawn(svc.clone().oneshot(delivery("e1", "block")));
    h.started.recv().await.unwrap();

    // The old owner's work fails; its release must not touch the new owner's claim.
    h.gate.add_permits(1);
    let old = old.await.unwrap().unwrap();
    assert_eq!(old.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(old.extensions().get::<Outcome>(), Some(&Outcome::LeaseLost));
    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.headers()["idempotency-outcome"], "in-flight");
    h.gate.add_permits(1);
    assert_eq!(new.await.unwrap().unwrap().status(), StatusCode::OK);
    let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.headers()["idempotency-outcome"], "duplicate");
    assert_eq!(h.runs(), 2);
}

#[tokio::test]
async fn header_key_with_body_fallback_does_not_buffer_when_the_header_is_there() {
    let h = Harness::new();
    let svc = h.service(
        IdempotencyLayer::new(MemoryStore::new())
            .key(key::header("x-event-id").or(key::json("/id")))
            .body_limit(16),
    );
    let big = Request::post("/")
        .header("x-event-id", "e1")
        .body(Full::new(Bytes::from(vec![b'x'; 4096])))
        .unwrap();
    assert_eq!(
        svc.clone().oneshot(big).await.unwrap().status(),
        StatusCode::OK
    );
    let big_without_header = Request::post("/")
        .body(Full::new(Bytes::from(vec![b'x'; 4096])))
        .unwrap();
    assert_eq!(
        svc.oneshot(big_without_header).await.unwrap().status(),
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert_eq!(h.runs(), 1);
}

/// `commit_when` takes any closure, one that captures state included: here a handler's 409
/// ("applied already") commits.
#[tokio::test]
async fn commit_when_takes_a_capturing_closure() {
    let store = MemoryStore::new();
    let done_anyway = [StatusCode::CONFLICT];
    let svc = layer(store.clone())
        .commit_when(move |status| status.is_success() || done_anyway.contains(&status))
        .layer(service_fn(|_req: Req| async {
            let mut res = Response::new(Full::new(Bytes::new()));
            *res.status_mut() = StatusCode::CONFLICT;
            Ok::<_, Infallible>(res)
        }));
    let first = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CONFLICT);
    assert_eq!(
        first.extensions().get::<Outcome>(),
        Some(&Outcome::Processed)
    );
    let again = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(again.headers()["idempotency-outcome"], "duplicate");
}

// ---- A streamed body that does not arrive (header keys) ----

type Streamed = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// One byte every 50 ms: `left` of them, or forever.
struct Trickle {
    next: Pin<Box<tokio::time::Sleep>>,
    left: Option<usize>,
}

fn trickle(left: Option<usize>) -> Streamed {
    let next = Box::pin(tokio::time::sleep(Duration::from_millis(50)));
    Trickle { next, left }.boxed()
}

impl Body for Trickle {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == Some(0) {
            return Poll::Ready(None);
        }
        std::task::ready!(self.next.as_mut().poll(cx));
        let at = tokio::time::Instant::now() + Duration::from_millis(50);
        self.next.as_mut().reset(at);
        self.left = self.left.map(|n| n - 1);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b" ")))))
    }
}

fn streamed(id: &str, body: Streamed) -> Request<Streamed> {
    Request::post("/hook")
        .header("x-event-id", id)
        .body(body)
        .unwrap()
}

/// A handler that reads its whole body and echoes it; a body it cannot read is answered 400
/// naming the error (as an axum extractor would), or, when it `ignores` the error, 200.
fn reader(
    runs: Arc<AtomicUsize>,
    ignores: bool,
) -> impl Service<
    Request<RequestBody<Streamed>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    service_fn(move |req: Request<RequestBody<Streamed>>| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move {
            let answer = match req.into_body().collect().await {
                Ok(body) => Response::new(Full::new(body.to_bytes())),
                Err(_) if ignores => Response::new(Full::new(Bytes::new())),
                Err(error) => {
                    assert!(
                        error.is::<tower_idempotency::body::BodyTimeoutError>(),
                        "{error}"
                    );
                    let mut res = Response::new(Full::new(Bytes::from(error.to_string())));
                    *res.status_mut() = StatusCode::BAD_REQUEST;
                    res
                }
            };
            Ok::<_, Infallible>(answer)
        }
    })
}

/// Sends `req`, failing (not hanging) if the delivery does not end.
async fn ended<S>(svc: S, req: Request<Streamed>) -> Res
where
    S: Service<Request<Streamed>, Response = Res, Error = Infallible>,
{
    tokio::time::timeout(Duration::from_secs(60), svc.oneshot(req))
        .await
        .expect("the delivery ends")
        .unwrap()
}

/// Promise: a header-keyed delivery whose body stalls or trickles holds its claim for no
/// longer than the body timeout: reading the body fails, the handler's error answer releases
/// the claim, and the genuine delivery of the same event then runs.
#[tokio::test(start_paused = true)]
async fn header_keyed_body_that_stalls_fails_its_read_and_releases_the_claim() {
    for (id, body) in [("stall", Endless.boxed()), ("trickle", trickle(None))] {
        let store = MemoryStore::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = layer(store.clone())
            .body_timeout(Duration::from_millis(200))
            .layer(reader(runs.clone(), false));
        let res = ended(svc.clone(), streamed(id, body)).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{id}");
        assert_eq!(
            body_text(res).await,
            "the request body did not arrive within 200ms"
        );
        assert_eq!(record(&store, id).await.state, KeyState::Released, "{id}");

        let genuine = Full::new(Bytes::from_static(b"payload")).boxed();
        let res = ended(svc, streamed(id, genuine)).await;
        assert_eq!(res.status(), StatusCode::OK, "{id}: not 409");
        assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
        assert_eq!(body_text(res).await, "payload");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

/// Promise: the claim of a delivery whose body did not arrive is released whatever the
/// handler answers: one that ignores the error and answers 200 (or a 4xx that `commit_when`
/// commits) is answered 408 problem+json instead, and nothing is committed.
#[tokio::test(start_paused = true)]
async fn stalled_body_is_released_whatever_the_handler_answers() {
    for (ignores, commits_all) in [(true, false), (false, true)] {
        let store = MemoryStore::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let mut configured = layer(store.clone()).body_timeout(Duration::from_millis(200));
        if commits_all {
            configured = configured.commit_when(|_| true);
        }
        let svc = configured.layer(reader(runs.clone(), ignores));
        let res = ended(svc.clone(), streamed("e1", Endless.boxed())).await;
        assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(res.headers()["idempotency-outcome"], "released");
        assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Released));
        assert_eq!(res.headers()["connection"], "close");
        let problem = problem(res).await;
        assert_eq!(problem["status"], 408, "{problem}");
        assert_eq!(record(&store, "e1").await.state, KeyState::Released);

        let genuine = Full::new(Bytes::from_static(b"payload")).boxed();
        let res = ended(svc, streamed("e1", genuine)).await;
        assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
        assert_eq!(record(&store, "e1").await.state, KeyState::Done);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

/// Promise: a streamed body that arrives within the body timeout is untouched, however long
/// the handler works between two reads: only the time it waits for the body counts.
#[tokio::test(start_paused = true)]
async fn body_arriving_in_time_is_unaffected() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    // Five bytes 50 ms apart: 250 ms in all, within the 1 s timeout.
    let svc = layer(store.clone())
        .body_timeout(Duration::from_secs(1))
        .layer(reader(runs.clone(), false));
    let res = ended(svc, streamed("slow", trickle(Some(5)))).await;
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(body_text(res).await, "     ");
    assert_eq!(record(&store, "slow").await.state, KeyState::Done);

    // A handler that works 3 s after the first byte, then reads the rest.
    let svc = layer(store.clone())
        .body_timeout(Duration::from_secs(1))
        .layer(service_fn(
            |req: Request<RequestBody<Streamed>>| async move {
                let mut body = req.into_body();
                let mut read = body.frame().await.unwrap().unwrap().into_data().unwrap();
                tokio::time::sleep(Duration::from_secs(3)).await;
                let rest = body.collect().await.unwrap().to_bytes();
                read = [read, rest].concat().into();
                Ok::<_, Infallible>(Response::new(Full::new(read)))
            },
        ));
    let res = ended(svc, streamed("working", trickle(Some(3)))).await;
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(body_text(res).await, "   ");
}

/// The shell hands its inner service out as tower-http's middleware do: by reference, to
/// change, and whole.
#[test]
fn the_inner_service_can_be_read_changed_and_taken_back() {
    #[derive(Clone)]
    struct Counter(u32);
    let mut service = IdempotencyLayer::new(MemoryStore::new()).layer(Counter(1));
    assert_eq!(service.get_ref().0, 1);
    service.get_mut().0 = 2;
    assert_eq!(service.get_ref().0, 2);
    assert_eq!(service.into_inner().0, 2);
}
