use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{HeaderMap, Request, StatusCode};
use tower::ServiceExt;

use super::*;
use crate::key;
use crate::store::inbox::{EntryState, InboxStore, StoredRequest};
use crate::store::{MemoryStore, Stale, StoreError};
use crate::{Drain, IdempotencyKey, Outcome};

fn delivery(id: &str, body: &str) -> Request<Body> {
    Request::post("/hooks")
        .header("x-event-id", id)
        .header("authorization", "Bearer secret")
        .header("x-kept", "yes")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

fn key_of(id: &str) -> IdempotencyKey {
    IdempotencyKey::new("default@/hooks", id).unwrap()
}

/// An app whose handler counts its runs and answers what `answer` says for the body.
fn app(
    inbox: &Inbox<MemoryStore>,
    runs: Arc<AtomicUsize>,
    answer: fn(&str) -> StatusCode,
) -> Router {
    Router::new().route(
        "/hooks",
        post(move |headers: HeaderMap, body: String| async move {
            assert!(
                headers.get("authorization").is_none(),
                "credentials dropped"
            );
            assert_eq!(headers["x-kept"], "yes");
            if body == "panic" {
                panic!("poison");
            }
            if body == "slow" {
                tokio::time::sleep(Duration::from_millis(1500)).await;
            }
            runs.fetch_add(1, Ordering::SeqCst);
            answer(&body)
        })
        .layer(inbox.layer().unverified().key(key::header("x-event-id"))),
    )
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn state(store: &MemoryStore, id: &str) -> Option<EntryState> {
    store.entry(&key_of(id)).await.unwrap().map(|e| e.state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_acknowledged_then_run_once_and_its_copies_are_duplicates() {
    let inbox = Inbox::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(&inbox, runs.clone(), |_| StatusCode::OK);
    let first = app.clone().oneshot(delivery("e1", "{}")).await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    assert_eq!(first.extensions().get(), Some(&Outcome::Queued));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "nothing runs on the request path"
    );
    let queued = app.clone().oneshot(delivery("e1", "{}")).await.unwrap();
    assert_eq!(queued.status(), StatusCode::OK);
    assert_eq!(queued.extensions().get(), Some(&Outcome::Duplicate));

    let workers = inbox.workers(app.clone()).spawn();
    until("the run", || runs.load(Ordering::SeqCst) == 1).await;
    until("done", || {
        futures_util::FutureExt::now_or_never(state(inbox.store(), "e1"))
            == Some(Some(EntryState::Done))
    })
    .await;
    let done = app.clone().oneshot(delivery("e1", "{}")).await.unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    workers.stop().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let stored = inbox
        .store()
        .stored_request(&key_of("e1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.uri, "/hooks");
    assert!(
        stored
            .headers
            .iter()
            .all(|(name, _)| name != "authorization")
    );
    assert_eq!(&stored.body[..], b"{}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_longer_than_the_stale_limit_is_never_taken_over() {
    let inbox = Inbox::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(&inbox, runs.clone(), |_| StatusCode::OK);
    app.clone().oneshot(delivery("long", "slow")).await.unwrap();
    let stale = Stale::reclaim_after(Duration::from_millis(600));
    // Two instances' workers on one store: the second would take a stale entry over.
    let one = inbox
        .workers(app.clone())
        .stale(stale)
        .poll_interval(Duration::from_millis(20));
    let two = inbox
        .workers(app.clone())
        .stale(stale)
        .poll_interval(Duration::from_millis(20));
    let (one, two) = (one.spawn(), two.spawn());
    until("the run", || runs.load(Ordering::SeqCst) >= 1).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    one.stop().await;
    two.stop().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let entry = inbox.store().entry(&key_of("long")).await.unwrap().unwrap();
    assert_eq!(
        (entry.state, entry.attempts, entry.crashes),
        (EntryState::Done, 1, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_nothing_is_stored() {
    let inbox = Inbox::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new().route(
        "/hooks",
        post(|| async { StatusCode::OK }).layer(
            inbox
                .layer()
                .unverified()
                .key(key::header("x-event-id"))
                .body_limit(8),
        ),
    );
    let big = app
        .clone()
        .oneshot(delivery("big", "0123456789"))
        .await
        .unwrap();
    assert_eq!(big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let keyless = Request::post("/hooks").body(Body::from("{}")).unwrap();
    let keyless = app.clone().oneshot(keyless).await.unwrap();
    assert_eq!(keyless.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        keyless.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(inbox.store().inbox_stats(None).await.unwrap().queued, 0);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_refuses_deliveries_and_stops_the_workers_after_their_runs() {
    let inbox = Inbox::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let drain = Drain::new();
    let counted = runs.clone();
    let app = Router::new().route(
        "/hooks",
        post(move |body: String| async move {
            if body == "slow" {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            counted.fetch_add(1, Ordering::SeqCst);
            StatusCode::OK
        })
        .layer(
            inbox
                .layer()
                .unverified()
                .key(key::header("x-event-id"))
                .drain(&drain),
        ),
    );
    app.clone().oneshot(delivery("slow", "slow")).await.unwrap();
    let workers = inbox.workers(app.clone()).drain(&drain).spawn();
    until("the slow run to start", || {
        futures_util::FutureExt::now_or_never(state(inbox.store(), "slow"))
            == Some(Some(EntryState::Running))
    })
    .await;
    let report = drain.drain(Duration::from_secs(5)).await;
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the running one finished");
    assert_eq!(state(inbox.store(), "slow").await, Some(EntryState::Done));
    let refused = app.clone().oneshot(delivery("late", "{}")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(state(inbox.store(), "late").await, None);
    until("the workers to stop", || workers.is_finished()).await;
}

/// A store whose every call fails.
#[derive(Clone, Debug)]
struct Down;

fn down<T>() -> Result<T, StoreError> {
    Err(StoreError::backend("down"))
}

impl InboxStore for Down {
    async fn enqueue(
        &self,
        _: &IdempotencyKey,
        _: &StoredRequest,
    ) -> Result<crate::store::inbox::Enqueued, StoreError> {
        down()
    }
    async fn take(
        &self,
        _: &crate::store::inbox::Take,
    ) -> Result<Vec<crate::store::inbox::Taken>, StoreError> {
        down()
    }
    async fn renew_entry(&self, _: &crate::store::Lease) -> Result<(), StoreError> {
        down()
    }
    async fn settle(
        &self,
        _: &crate::store::Lease,
        _: &crate::store::inbox::Settlement,
        _: &[crate::store::inbox::Attempt],
    ) -> Result<(), StoreError> {
        down()
    }
    async fn entries(
        &self,
        _: Option<&str>,
        _: &[EntryState],
        _: usize,
    ) -> Result<Vec<crate::store::inbox::Entry>, StoreError> {
        down()
    }
    async fn entry(
        &self,
        _: &IdempotencyKey,
    ) -> Result<Option<crate::store::inbox::Entry>, StoreError> {
        down()
    }
    async fn stored_request(
        &self,
        _: &IdempotencyKey,
    ) -> Result<Option<StoredRequest>, StoreError> {
        down()
    }
    async fn start(&self, _: &[crate::store::Lease]) -> Result<Vec<bool>, StoreError> {
        down()
    }
    async fn give_back(&self, _: &[crate::store::LeaseToken]) -> Result<u64, StoreError> {
        down()
    }
    async fn retry_now(
        &self,
        _: &IdempotencyKey,
        _: crate::store::inbox::Running,
    ) -> Result<bool, StoreError> {
        down()
    }
    async fn retry_dead(&self, _: &str) -> Result<u64, StoreError> {
        down()
    }
    async fn discard(
        &self,
        _: &IdempotencyKey,
        _: crate::store::inbox::Running,
    ) -> Result<bool, StoreError> {
        down()
    }
    async fn inbox_stats(
        &self,
        _: Option<&str>,
    ) -> Result<crate::store::inbox::InboxStats, StoreError> {
        down()
    }
    async fn purge_inbox(
        &self,
        _: Duration,
        _: Duration,
        _: usize,
    ) -> Result<crate::store::inbox::Purged, StoreError> {
        down()
    }
}

#[tokio::test]
async fn a_store_that_fails_gets_503_and_the_handler_never_runs() {
    let inbox = Inbox::new(Down);
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Router::new().route(
        "/hooks",
        post(move || async move {
            counted.fetch_add(1, Ordering::SeqCst);
            StatusCode::OK
        })
        .layer(inbox.layer().unverified().key(key::header("x-event-id"))),
    );
    let res = app.clone().oneshot(delivery("e1", "{}")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    let workers = inbox
        .workers(app)
        .poll_interval(Duration::from_millis(5))
        .spawn();
    tokio::time::sleep(Duration::from_millis(50)).await;
    workers.stop().await;
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[cfg(feature = "verify")]
#[tokio::test]
async fn a_forged_delivery_gets_401_and_nothing_is_stored() {
    let inbox = Inbox::new(MemoryStore::new());
    let app = Router::new().route(
        "/hooks",
        post(|| async { StatusCode::OK }).layer(
            inbox
                .layer()
                .key(key::github())
                .verify(crate::verify::github("It's a Secret to Everybody")),
        ),
    );
    let forged = Request::post("/hooks")
        .header("x-github-delivery", "d1")
        .header("x-hub-signature-256", format!("sha256={}", "0".repeat(64)))
        .body(Body::from("{}"))
        .unwrap();
    let res = app.oneshot(forged).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(inbox.store().inbox_stats(None).await.unwrap().queued, 0);
}

/// A body that never arrives: an upload stalled half way.
struct Stalled;

impl http_body::Body for Stalled {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Pending
    }
}

#[tokio::test]
async fn stalled_and_malformed_bodies_store_nothing() {
    let inbox = Inbox::new(MemoryStore::new());
    let app = Router::new()
        .route(
            "/hooks",
            post(|| async { StatusCode::OK }).layer(
                inbox
                    .layer()
                    .unverified()
                    .key(key::header("x-event-id"))
                    .body_timeout(Duration::from_millis(50)),
            ),
        )
        .route(
            "/json",
            post(|| async { StatusCode::OK })
                .layer(inbox.layer().unverified().key(key::json("/id"))),
        );
    let stalled = Request::post("/hooks")
        .header("x-event-id", "stalled")
        .body(Body::new(Stalled))
        .unwrap();
    let res = app.clone().oneshot(stalled).await.unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    for bad in ["{\"id\":", "not json", "{\"other\":1}", "{\"id\":{}}"] {
        let req = Request::post("/json").body(Body::from(bad)).unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
    }
    let stats = inbox.store().inbox_stats(None).await.unwrap();
    assert_eq!((stats.queued, stats.running, stats.dead), (0, 0, 0));
}
