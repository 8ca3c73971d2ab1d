//! Promise: the handler can tell a sender's retry from a first delivery. The lease in its
//! request's extensions ([`LeaseHandle`]) says which delivery of the event claimed: 1 for the
//! first, 2 for the retry after a failed run, whichever instance the retry reached.
//!
//! Composed as apps are: the route inside `Router::nest`, an app-wide timeout in front, two
//! instances with a pool each on one SQLite file; and on the memory store.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_idempotency::store::{MemoryStore, Store};
use tower_idempotency::{IdempotencyLayer, LeaseHandle, key};

/// The deliveries the handler saw, by the number its lease said.
type Seen = Arc<Mutex<Vec<Option<u64>>>>;

/// An app whose handler records its delivery number and fails its first run.
fn app<St: Store + Clone>(store: St, seen: Seen) -> Router {
    let hooks = Router::new().route(
        "/github",
        post(move |req: Request<axum::body::Body>| {
            let seen = seen.clone();
            async move {
                let number = req
                    .extensions()
                    .get::<LeaseHandle>()
                    .and_then(|handle| handle.lease().deliveries());
                let mut seen = seen.lock().unwrap();
                seen.push(number);
                if seen.len() == 1 {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::OK
                }
            }
        })
        .layer(IdempotencyLayer::new(store).key(key::github())),
    );
    Router::new()
        .nest("/hooks", hooks)
        .layer(middleware::from_fn(timeout))
}

/// An app-wide timeout answering 408, as tower-http's `TimeoutLayer` does.
async fn timeout(req: axum::extract::Request, next: Next) -> Response {
    match tokio::time::timeout(Duration::from_secs(10), next.run(req)).await {
        Ok(res) => res,
        Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
    }
}

fn delivery(id: &str) -> Request<axum::body::Body> {
    Request::post("/hooks/github")
        .header("x-github-delivery", id)
        .header("content-type", "application/json")
        .body(axum::body::Body::from("{}"))
        .unwrap()
}

/// First delivery on `first`, its retry on `second`, then a duplicate on `first`.
async fn a_retry_is_the_second_delivery(first: Router, second: Router, seen: &Seen, id: &str) {
    let answer = first.clone().oneshot(delivery(id)).await.unwrap();
    assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let answer = second.oneshot(delivery(id)).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let answer = first.oneshot(delivery(id)).await.unwrap();
    assert_eq!(
        answer.status(),
        StatusCode::OK,
        "a duplicate of a done event"
    );
    assert_eq!(*seen.lock().unwrap(), [Some(1), Some(2)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_sees_which_delivery_it_runs_on_sqlite_across_instances() {
    let seen = Seen::default();
    let path = common::db::sqlite_file("delivery-number");
    let (a, b) = (
        tower_idempotency::store::SqliteStore::new(common::db::sqlite_file_pool(path).await),
        tower_idempotency::store::SqliteStore::new(common::db::sqlite_file_pool(path).await),
    );
    a.migrate().await.unwrap();
    let id = common::unique_namespace("evt");
    a_retry_is_the_second_delivery(app(a, seen.clone()), app(b, seen.clone()), &seen, &id).await;
}

#[tokio::test]
async fn the_handler_sees_which_delivery_it_runs_on_memory() {
    let seen = Seen::default();
    let store = MemoryStore::new();
    let app = app(store, seen.clone());
    a_retry_is_the_second_delivery(app.clone(), app, &seen, "evt_1").await;
}
