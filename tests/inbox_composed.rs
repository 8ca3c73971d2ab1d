//! Promise: in inbox mode each event is settled by its handler's own answer, whatever the app
//! does around the route (DESIGN.md, "Tests that matter" 8).
//!
//! - the route inside `Router::nest` and `Router::nest_service`, with a path parameter: the
//!   stored path is the one the app received, and the worker's request reaches the handler;
//! - behind an app-wide timeout shorter than the handler: every handler runs once, to the end,
//!   and settles its entry done (the timeout's 408 is no failure);
//! - behind an app-wide inline `IdempotencyLayer`: the worker's request is no duplicate of the
//!   sender's, and the handler runs once;
//! - behind an auth layer: one that checks a header the inbox keeps lets the worker's request
//!   through; one that checks a header the inbox drops answers 401, and the attempt fails,
//!   saying it never reached its route;
//! - a worker app without the route (404), and one whose fallback answers 200: the entry
//!   never settles done; its attempts fail and say why, and it ends dead;
//! - all of it at once over two instances on PostgreSQL, each with its own pool and workers.
//!
//! Each check fails if the entry were settled by what the app answered.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Request};
use axum::middleware::{Next, from_fn};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::StatusCode;
use tower::ServiceExt;
use tower_idempotency::inbox::{Backoff, Inbox, InboxDelivery};
use tower_idempotency::store::MemoryStore;
use tower_idempotency::store::inbox::{AttemptResult, Entry, EntryState, InboxStore};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, key};

/// How long the app-wide timeout lets a request run.
const APP_TIMEOUT: Duration = Duration::from_millis(150);
/// How long each handler works: three times the app's timeout.
const WORK: Duration = Duration::from_millis(450);

/// Per event: how many handlers started, and how many finished.
type Runs = Arc<Mutex<HashMap<String, (usize, usize)>>>;

/// An app-wide timeout answering 408, as tower-http's `TimeoutLayer` does.
async fn timeout(req: Request, next: Next) -> Response {
    match tokio::time::timeout(APP_TIMEOUT, next.run(req)).await {
        Ok(res) => res,
        Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
    }
}

/// An app-wide check of `x-api-key`, a header the inbox keeps.
async fn api_key(req: Request, next: Next) -> Response {
    if req.headers().get("x-api-key").is_some_and(|v| v == "k") {
        next.run(req).await
    } else {
        StatusCode::UNAUTHORIZED.into_response()
    }
}

/// An app-wide check of `authorization`, a header the inbox drops by default.
async fn bearer(req: Request, next: Next) -> Response {
    if req.headers().contains_key("authorization") {
        next.run(req).await
    } else {
        StatusCode::UNAUTHORIZED.into_response()
    }
}

/// The handler: slow, with a path parameter, counting its starts and ends by event.
fn handler(
    runs: Runs,
) -> impl Fn(Path<String>, Request) -> std::pin::Pin<Box<dyn Future<Output = StatusCode> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    move |Path(shop): Path<String>, req: Request| {
        let runs = runs.clone();
        Box::pin(async move {
            assert_eq!(shop, "acme", "the path parameter reaches the handler");
            let delivery = req.extensions().get::<InboxDelivery>().cloned();
            let event = req.headers()["x-event-id"].to_str().unwrap().to_owned();
            if delivery.is_none() {
                // Only workers' requests reach the handler.
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
            runs.lock().unwrap().entry(event.clone()).or_default().0 += 1;
            tokio::time::sleep(WORK).await;
            runs.lock().unwrap().entry(event).or_default().1 += 1;
            StatusCode::NO_CONTENT
        })
    }
}

/// A delivery of `event` to `uri`, with the headers an auth layer may look for.
fn delivery(uri: &str, event: &str) -> Request {
    http::Request::post(uri)
        .header("x-event-id", event)
        .header("x-api-key", "k")
        .header("authorization", "Bearer t")
        .body(axum::body::Body::from(format!("{{\"event\":\"{event}\"}}")))
        .unwrap()
}

/// The inbox route of `inbox`, under `/shop/{shop}`.
fn route<St: InboxStore + Clone>(inbox: &Inbox<St>, runs: &Runs) -> Router {
    Router::new().route(
        "/shop/{shop}",
        post(handler(runs.clone())).layer(
            inbox
                .layer()
                .key(key::header("x-event-id").namespace("shop"))
                .unverified(),
        ),
    )
}

/// The key of `event`'s entry (its namespace holds the route's scope).
async fn key<St: InboxStore>(store: &St, event: &str) -> IdempotencyKey {
    let entries = store.entries(None, &[], 100_000).await.unwrap();
    let found = entries.into_iter().find(|entry| entry.key.value() == event);
    found.unwrap_or_else(|| panic!("no entry for {event}")).key
}

/// Waits, up to 20 seconds, until `event`'s entry is in `state`; answers it.
async fn until_state<St: InboxStore>(store: &St, event: &str, state: EntryState) -> Entry {
    let k = key(store, event).await;
    for _ in 0..2000 {
        if let Some(entry) = store.entry(&k).await.unwrap()
            && entry.state == state
        {
            return entry;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{k} never reached {state:?}: {:?}",
        store.entry(&k).await.unwrap()
    );
}

/// Sends `events` to `app` at `uri` and checks each was stored (202).
async fn send_all(app: &Router, uri: &str, events: &[&str]) {
    for event in events {
        let res = app.clone().oneshot(delivery(uri, event)).await.unwrap();
        assert_eq!(res.status(), StatusCode::ACCEPTED, "{event}");
    }
}

/// Each event's handler started once and finished once, and its entry is done after one
/// attempt that the handler answered 204.
async fn each_ran_once<St: InboxStore>(store: &St, runs: &Runs, events: &[&str]) {
    for event in events {
        let entry = until_state(store, event, EntryState::Done).await;
        assert_eq!(entry.attempts, 1, "{event}: {entry:?}");
        assert_eq!(
            entry.history.last().map(|a| &a.result),
            Some(&AttemptResult::Status(204)),
            "{event}: settled by the handler's own answer"
        );
        assert_eq!(
            runs.lock().unwrap().get(*event),
            Some(&(1, 1)),
            "{event}: started once, finished once"
        );
    }
}

fn slow_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(20), Duration::from_millis(20), 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_route_behind_an_app_wide_timeout_runs_each_handler_once_to_the_end() {
    let inbox = Inbox::new(MemoryStore::new());
    let runs = Runs::default();
    let app = Router::new()
        .nest("/hooks", route(&inbox, &runs))
        .layer(from_fn(timeout));
    let workers = inbox.workers(app.clone()).spawn();
    let events = ["n-1", "n-2", "n-3"];
    send_all(&app, "/hooks/shop/acme", &events).await;
    each_ran_once(inbox.store(), &runs, &events).await;
    let n1 = key(inbox.store(), "n-1").await;
    assert!(n1.namespace().starts_with("shop@"), "{n1}");
    let stored = inbox.store().stored_request(&n1).await.unwrap();
    assert_eq!(
        stored.unwrap().uri,
        "/hooks/shop/acme",
        "the URI the app received"
    );
    workers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_under_nest_service_runs() {
    let inbox = Inbox::new(MemoryStore::new());
    let runs = Runs::default();
    let app = Router::new().nest_service("/hooks", route(&inbox, &runs));
    let workers = inbox.workers(app.clone()).spawn();
    send_all(&app, "/hooks/shop/acme?from=test", &["s-1"]).await;
    each_ran_once(inbox.store(), &runs, &["s-1"]).await;
    let s1 = key(inbox.store(), "s-1").await;
    let stored = inbox.store().stored_request(&s1).await.unwrap();
    assert_eq!(stored.unwrap().uri, "/hooks/shop/acme?from=test");
    workers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_an_app_wide_inline_layer_the_handler_runs_once() {
    let inbox = Inbox::new(MemoryStore::new());
    let runs = Runs::default();
    let inline = MemoryStore::new();
    let app = Router::new()
        .nest("/hooks", route(&inbox, &runs))
        .layer(IdempotencyLayer::new(inline).key(key::header("x-event-id")));
    let workers = inbox.workers(app.clone()).spawn();
    send_all(&app, "/hooks/shop/acme", &["i-1", "i-2"]).await;
    // The sender's copy is a duplicate for the inline layer, answered without a write.
    let again = app
        .clone()
        .oneshot(delivery("/hooks/shop/acme", "i-1"))
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    each_ran_once(inbox.store(), &runs, &["i-1", "i-2"]).await;
    workers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_an_auth_layer_on_a_kept_header_the_handler_runs() {
    let inbox = Inbox::new(MemoryStore::new());
    let runs = Runs::default();
    let app = Router::new()
        .nest("/hooks", route(&inbox, &runs))
        .layer(from_fn(api_key));
    let workers = inbox.workers(app.clone()).spawn();
    send_all(&app, "/hooks/shop/acme", &["a-1"]).await;
    each_ran_once(inbox.store(), &runs, &["a-1"]).await;
    workers.stop().await;
}

/// The attempts of an entry whose worker's request never reached its route: each failed, and
/// says what the app answered instead; the entry is dead after its two attempts, never done,
/// and its handler never ran.
async fn never_reached(inbox: &Inbox<MemoryStore>, runs: &Runs, event: &str, answered: &str) {
    let entry = until_state(inbox.store(), event, EntryState::Dead).await;
    assert_eq!(entry.attempts, 2, "{entry:?}");
    for attempt in &entry.history {
        let AttemptResult::Error(said) = &attempt.result else {
            panic!("a failed attempt: {attempt:?}");
        };
        assert_eq!(
            said,
            &format!("did not reach its inbox route: the app answered {answered}")
        );
    }
    assert_eq!(
        runs.lock().unwrap().get(event),
        None,
        "the handler never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_layer_on_a_dropped_header_fails_the_attempts_and_says_so() {
    let inbox = Inbox::new(MemoryStore::new());
    let runs = Runs::default();
    let app = Router::new()
        .nest("/hooks", route(&inbox, &runs))
        .layer(from_fn(bearer));
    let workers = inbox.workers(app.clone()).backoff(slow_backoff()).spawn();
    send_all(&app, "/hooks/shop/acme", &["b-1"]).await;
    never_reached(&inbox, &runs, "b-1", "401 Unauthorized").await;
    workers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_app_without_the_route_never_settles_done() {
    let inbox = Inbox::new(MemoryStore::new());
    let runs = Runs::default();
    let app = Router::new().nest("/hooks", route(&inbox, &runs));
    // The workers are given another app: one without the route, and one whose fallback
    // answers 200 to anything.
    let missing = inbox.workers(Router::new()).backoff(slow_backoff()).spawn();
    send_all(&app, "/hooks/shop/acme", &["m-1"]).await;
    never_reached(&inbox, &runs, "m-1", "404 Not Found").await;
    missing.stop().await;

    let fallback = Router::new().fallback(|| async { StatusCode::OK });
    let ok = inbox.workers(fallback).backoff(slow_backoff()).spawn();
    send_all(&app, "/hooks/shop/acme", &["m-2"]).await;
    never_reached(&inbox, &runs, "m-2", "200 OK").await;
    ok.stop().await;
}

/// Two instances, each its own pool and workers, serving the same app: nested, behind an
/// app-wide inline layer (on the instance's own claims) and an app-wide timeout shorter than
/// the handler. 20 events, each sent to both instances: each handler runs once, to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_on_postgres_compose_as_apps_do() {
    let Some(first) = common::inbox::postgres("inbox_composed").await else {
        return;
    };
    common::inbox::emptied(&first).await;
    let runs = Runs::default();
    let mut apps = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..2 {
        let store = common::inbox::postgres("inbox_composed").await.unwrap();
        let inbox = Inbox::new(store.clone());
        let app = Router::new()
            .nest("/hooks", route(&inbox, &runs))
            .layer(IdempotencyLayer::new(store).key(key::header("x-event-id")))
            .layer(from_fn(timeout));
        workers.push(inbox.workers(app.clone()).concurrency(8).spawn());
        apps.push(app);
    }
    // Fresh ids: the inline layer's claims table keeps earlier runs' keys.
    let run = common::unique_namespace("pg");
    let events: Vec<String> = (0..20).map(|n| format!("{run}-{n}")).collect();
    let sends = events.iter().flat_map(|event| {
        apps.iter().map(move |app| {
            let (app, event) = (app.clone(), event.clone());
            tokio::spawn(async move {
                let res = app
                    .oneshot(delivery("/hooks/shop/acme", &event))
                    .await
                    .unwrap();
                res.status()
            })
        })
    });
    for status in futures_util::future::join_all(sends.collect::<Vec<_>>()).await {
        let status = status.unwrap();
        assert!(
            status.is_success() || status == StatusCode::CONFLICT,
            "{status}"
        );
    }
    let names: Vec<&str> = events.iter().map(String::as_str).collect();
    each_ran_once(&first, &runs, &names).await;
    for handle in workers {
        handle.stop().await;
    }
}
