//! The version guard's own behaviour (`tower_idempotency::version_guard`): what it answers by
//! itself (400, 413, 503), entities that pass through, panics, legal transitions, its former
//! names, entities shared by routes.
//!
//! What every backend promises of the guard (out-of-order deliveries end in the newest
//! version's state, one version of an entity runs at a time, the `VersionStore` contract, and
//! on SQL backends `version_guard::advance` in transactional mode) is the `versions` and
//! `advance` suites of `backend_suite!` (`tests/common/versions.rs`, `advance.rs`), which each
//! `tests/store_<backend>.rs` runs.

#![cfg(feature = "memory")]

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::body::RequestBody;
use tower_idempotency::store::{MemoryStore, Resolution, Stale};
use tower_idempotency::version_guard::{self, VersionGuardError, VersionGuardLayer, VersionStore};
use tower_idempotency::{IdempotencyKey, MissingKey, Outcome, key};

use common::problem;
use common::versions::{Harness, delivery, handler, order_layer, ordered, outcome_header};

#[cfg(feature = "sqlite")]
async fn sqlite_store() -> Option<tower_idempotency::store::SqliteStore> {
    common::db::sqlite_file_store("order").await
}

// ---- What the layer answers by itself (memory) ----

fn raw(body: &str) -> Request<Full<Bytes>> {
    Request::post("/webhooks")
        .header("x-behave", "ok")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

#[tokio::test]
async fn missing_or_invalid_entity_and_version_are_400() {
    let h = Harness::new();
    let svc = ordered(MemoryStore::new(), "subscription", &h);
    let cases = [
        (
            r#"{"data":{"object":{"version":1}}}"#,
            "no entity id found: expected JSON field `/data/object/id`",
        ),
        (
            r#"{"data":{"object":{"id":"sub_1"}}}"#,
            "no version found: expected JSON field `/data/object/version`",
        ),
        (
            r#"{"data":{"object":{"id":"","version":1}}}"#,
            "invalid entity id",
        ),
        (
            r#"{"data":{"object":{"id":"sub_1","version":"yesterday"}}}"#,
            "invalid version",
        ),
        (
            r#"{"data":{"object":{"id":"sub_1","version":1.5}}}"#,
            "invalid version",
        ),
        // What is wrong is reported before what is absent.
        (r#"{"data":{"object":{"version":true}}}"#, "invalid version"),
        ("not json", "not valid JSON"),
    ];
    for (body, detail) in cases {
        let res = svc.clone().oneshot(raw(body)).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Rejected));
        assert!(res.extensions().get::<VersionGuardError>().is_some());
        let problem = problem(res).await;
        let got = problem["detail"].as_str().unwrap();
        assert!(got.contains(detail), "{body}: {got}");
    }
    let res = svc.clone().oneshot(raw(r#"{"data":{}}"#)).await.unwrap();
    let error = res.extensions().get::<VersionGuardError>();
    assert!(error.is_some_and(|e| e.is_missing()), "{error:?}");
    assert_eq!(
        problem(res).await["expected"],
        "JSON field `/data/object/id`"
    );
    let invalid = raw(r#"{"data":{"object":{"id":"","version":1}}}"#);
    let res = svc.clone().oneshot(invalid).await.unwrap();
    let error = res.extensions().get::<VersionGuardError>();
    assert!(error.is_some_and(|e| !e.is_missing()), "{error:?}");
    assert_eq!(h.business.runs(), 0);
}

#[tokio::test]
async fn missing_entity_can_pass_through_but_invalid_cannot() {
    let h = Harness::new();
    let svc = order_layer(MemoryStore::new(), "subscription")
        .missing_key(MissingKey::PassThrough)
        .layer(handler(h.handler.clone()));
    for invalid in [
        r#"{"data":{"object":{"id":"sub_1","version":"soon"}}}"#,
        r#"{"data":{"object":{"id":"","version":1}}}"#,
        r#"{"data":{"object":{"version":false}}}"#,
    ] {
        let res = svc.clone().oneshot(raw(invalid)).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{invalid}");
    }
    assert_eq!(h.business.runs(), 0);

    // A `ping` without an object runs the handler unordered.
    let passes = service_fn(|_req: Request<RequestBody<Full<Bytes>>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let svc = order_layer(MemoryStore::new(), "subscription")
        .missing_key(MissingKey::PassThrough)
        .layer(passes);
    let res = svc.oneshot(raw(r#"{"type":"ping"}"#)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.extensions().get::<Outcome>(),
        Some(&Outcome::PassedThrough)
    );
}

#[tokio::test]
async fn header_extractors_leave_the_body_alone_and_it_arrives_intact() {
    let store = MemoryStore::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_by_handler = seen.clone();
    let echo = service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
        let seen = seen_by_handler.clone();
        async move {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            seen.lock().unwrap().push(body);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    });
    let headers = VersionGuardLayer::new(store.clone())
        .entity(key::header("x-entity").namespace("acme"))
        .version(version_guard::version::header("x-version"))
        .layer(echo.clone());
    let send = |version: &str, body: &'static str| {
        Request::post("/")
            .header("x-entity", "order_1")
            .header("x-version", version)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    let res = headers
        .clone()
        .oneshot(send("2024-05-01T14:00:03Z", "not json at all"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    let res = headers
        .oneshot(send("2024-05-01T16:00:01+02:00", "older"))
        .await
        .unwrap();
    assert_eq!(outcome_header(&res), Some("outdated"));
    let entity = IdempotencyKey::new("acme", "order_1").unwrap();
    assert_eq!(
        store.applied_version(&entity).await.unwrap(),
        Some(1_714_572_003_000_000)
    );

    // Body extractors buffer it, and the handler still reads every byte.
    let json = order_layer(store, "acme-json").layer(echo);
    let event = r#"{"data":{"object":{"id":"o","version":3}},"padding":"ééé"}"#;
    json.oneshot(raw(event)).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), ["not json at all", event]);
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let h = Harness::new();
    let svc = order_layer(MemoryStore::new(), "subscription")
        .body_limit(64)
        .layer(handler(h.handler.clone()));
    let big = format!(
        r#"{{"data":{{"object":{{"id":"sub_1","version":1}}}},"pad":"{}"}}"#,
        "x".repeat(100)
    );
    let res = svc.oneshot(raw(&big)).await.unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(h.business.runs(), 0);
}

#[tokio::test]
async fn panic_releases_the_pending_version_under_reclaim_and_keeps_it_under_hold() {
    let store = MemoryStore::new();
    let panics = service_fn(|req: Request<RequestBody<Full<Bytes>>>| async move {
        if req.headers()["x-behave"] == "panic" {
            panic!("the handler panicked");
        }
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let reclaim = order_layer(store.clone(), "reclaim").layer(panics);
    let join = tokio::spawn(
        reclaim
            .clone()
            .oneshot(delivery("e", "sub_1", "active", 1, "panic")),
    )
    .await;
    assert!(join.unwrap_err().is_panic());
    let res = reclaim
        .oneshot(delivery("e", "sub_1", "active", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));

    let held = Arc::new(AtomicUsize::new(0));
    let hook = held.clone();
    let hold = order_layer(store.clone(), "hold")
        .stale(Stale::hold_after(Duration::from_millis(50)))
        .on_held(move |entity, _pending| {
            assert_eq!(entity.value(), "sub_1");
            hook.fetch_add(1, Ordering::SeqCst);
        })
        .layer(panics);
    let join = tokio::spawn(
        hold.clone()
            .oneshot(delivery("e", "sub_1", "active", 1, "panic")),
    )
    .await;
    assert!(join.unwrap_err().is_panic());
    let res = hold
        .clone()
        .oneshot(delivery("e", "sub_1", "active", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT, "pending, not stale yet");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let res = hold
        .clone()
        .oneshot(delivery("e", "sub_1", "active", 2, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Held));
    assert!(
        res.headers().get("retry-after").is_none(),
        "only a person can settle it"
    );
    assert_eq!(held.load(Ordering::SeqCst), 1);
    let entity = IdempotencyKey::new("hold", "sub_1").unwrap();
    assert!(
        store
            .resolve_version(&entity, Resolution::Release)
            .await
            .unwrap()
    );
    let res = hold
        .oneshot(delivery("e", "sub_1", "active", 2, "ok"))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn store_failure_is_503_and_the_handler_does_not_run() {
    let store = sqlite_store().await.unwrap();
    store.pool().close().await;
    let h = Harness::new();
    let res = ordered(store, "down", &h)
        .oneshot(delivery("e", "sub_1", "active", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(h.business.runs(), 0);
}

// ---- Legal transitions in a handler ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Incomplete,
    Active,
    Cancelled,
    Expired,
}

impl Status {
    fn parse(s: &str) -> Self {
        match s {
            "incomplete" => Self::Incomplete,
            "active" => Self::Active,
            "cancelled" => Self::Cancelled,
            "expired" => Self::Expired,
            other => panic!("unknown status {other}"),
        }
    }
}

const SUBSCRIPTION: version_guard::Lifecycle<Status> = version_guard::Lifecycle::from_static(&[
    (Status::Incomplete, Status::Active),
    (Status::Incomplete, Status::Expired),
    (Status::Active, Status::Cancelled),
]);

/// The handler checks the lifecycle against the entity's current state: an illegal transition
/// is refused with 409 problem+json and not applied (the version is released, so a retry may
/// run once it is legal); a legal one applies.
#[tokio::test]
async fn illegal_transition_is_refused_and_reported_legal_one_applies() {
    let states = Arc::new(Mutex::new(HashMap::<String, Status>::new()));
    let db = states.clone();
    let svc = order_layer(MemoryStore::new(), "subscription").layer(service_fn(
        move |req: Request<RequestBody<Full<Bytes>>>| {
            let db = db.clone();
            async move {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let id = event["data"]["object"]["id"].as_str().unwrap().to_owned();
                let to = Status::parse(event["data"]["object"]["status"].as_str().unwrap());
                let mut db = db.lock().unwrap();
                if let Some(&from) = db.get(&id)
                    && let Err(illegal) = SUBSCRIPTION.check(from, to)
                {
                    return Ok::<_, Infallible>(illegal.to_response::<Full<Bytes>>());
                }
                db.insert(id, to);
                Ok(Response::new(Full::new(Bytes::new())))
            }
        },
    ));
    let send = |status: &str, version: i64| delivery("e", "sub_1", status, version, "ok");

    assert_eq!(
        svc.clone()
            .oneshot(send("incomplete", 1))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone()
            .oneshot(send("expired", 2))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    // expired -> active: refused and reported, not applied.
    let res = svc.clone().oneshot(send("active", 3)).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Released));
    let problem = problem(res).await;
    assert_eq!(
        problem["detail"],
        "illegal transition from Expired to Active"
    );
    assert_eq!(
        (problem["from"].as_str(), problem["to"].as_str()),
        (Some("Expired"), Some("Active"))
    );
    assert_eq!(states.lock().unwrap()["sub_1"], Status::Expired);

    // A legal transition on another subscription applies.
    let res = svc
        .clone()
        .oneshot(delivery("e", "sub_2", "incomplete", 1, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = svc
        .oneshot(delivery("e", "sub_2", "active", 2, "ok"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(states.lock().unwrap()["sub_2"], Status::Active);
}

/// The version guard's entities are shared by every route by default: events about one entity
/// that arrive on two endpoints are still applied in order.
#[tokio::test]
async fn an_entity_is_ordered_across_routes() {
    let store = MemoryStore::new();
    let route = || {
        VersionGuardLayer::new(store.clone())
            .entity(key::header("x-entity").namespace("subscription"))
            .version(version_guard::version::header("x-version"))
            .layer(service_fn(
                |_req: Request<RequestBody<Full<Bytes>>>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                },
            ))
    };
    let send = |path: &str, version: &str| {
        Request::post(path)
            .header("x-entity", "sub_1")
            .header("x-version", version)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let updated = route().oneshot(send("/hooks/updated", "2")).await.unwrap();
    assert_eq!(updated.status(), StatusCode::OK);
    let late = route().oneshot(send("/hooks/deleted", "1")).await.unwrap();
    assert_eq!(outcome_header(&late), Some("outdated"));
}

/// What the docs promise of the guard against a replayed unsigned delivery id (GitHub,
/// Shopify, Twilio): a copy of an older delivery, with a fresh id, is outdated and runs
/// nothing; a copy of the newest delivery carries the applied version and runs again.
#[tokio::test]
async fn a_replay_of_an_older_delivery_is_outdated_but_of_the_newest_runs_again() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let svc = tower::ServiceBuilder::new()
        .layer(tower_idempotency::IdempotencyLayer::new(store.clone()).key(key::shopify()))
        .layer(
            VersionGuardLayer::new(store)
                .entity(key::header("x-entity").namespace("order"))
                .version(version_guard::version::header("x-version")),
        )
        .service(service_fn(
            move |_req: Request<RequestBody<RequestBody<Full<Bytes>>>>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
            },
        ));
    let send = |id: &str, version: &str| {
        Request::post("/webhooks/shopify")
            .header("x-shopify-webhook-id", id)
            .header("x-entity", "order_1")
            .header("x-version", version)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    for (id, version) in [("d-1", "1"), ("d-2", "2")] {
        let res = svc.clone().oneshot(send(id, version)).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // The older delivery replayed with a fresh id: outdated.
    let older = svc.clone().oneshot(send("forged-1", "1")).await.unwrap();
    assert_eq!(outcome_header(&older), Some("outdated"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // The newest delivery replayed with a fresh id: the same version, so it runs again.
    let newest = svc.oneshot(send("forged-2", "2")).await.unwrap();
    assert_eq!(newest.status(), StatusCode::OK);
    assert_eq!(outcome_header(&newest), None);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// A body that never arrives.
struct Stalled;

impl Body for Stalled {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        std::task::Poll::Pending
    }
}

/// Promise: with header extractors, a delivery whose body does not arrive within the body
/// timeout releases the entity's pending version whatever the handler answers (one that
/// ignores the failed read and answers 200 is answered 408), so the genuine delivery of that
/// version then applies instead of meeting a 409.
#[tokio::test(start_paused = true)]
async fn stalled_body_releases_the_pending_version() {
    type Streamed = http_body_util::combinators::BoxBody<Bytes, Infallible>;
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let svc = VersionGuardLayer::new(store.clone())
        .entity(key::header("x-entity").namespace("acme"))
        .version(version_guard::version::header("x-version"))
        .body_timeout(Duration::from_millis(200))
        .layer(service_fn(move |req: Request<RequestBody<Streamed>>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let _ignored = req.into_body().collect().await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            }
        }));
    let send = |body: Streamed| {
        Request::post("/")
            .header("x-entity", "order_1")
            .header("x-version", "7")
            .body(body)
            .unwrap()
    };
    let stalled = svc.clone().oneshot(send(Stalled.boxed()));
    let res = tokio::time::timeout(Duration::from_secs(60), stalled)
        .await
        .expect("the delivery ends")
        .unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(outcome_header(&res), Some("released"));
    assert_eq!(problem(res).await["status"], 408);
    let entity = IdempotencyKey::new("acme", "order_1").unwrap();
    assert_eq!(store.applied_version(&entity).await.unwrap(), None);

    let genuine = Full::new(Bytes::from_static(b"{}")).boxed();
    let res = svc.oneshot(send(genuine)).await.unwrap();
    assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Processed));
    assert_eq!(store.applied_version(&entity).await.unwrap(), Some(7));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
