//! The version guard's own behaviour (`tower_idempotency::version_guard`): what it answers by
//! itself (400, 413, 503), entities that pass through, panics, legal transitions, its former
//! names; and transactional mode's `version_guard::advance` on every SQL backend (an
//! unreachable database skips the test, or fails it under `CI`).
//!
//! What every backend promises of the guard (out-of-order deliveries end in the newest
//! version's state, one version of an entity runs at a time, the `VersionStore` contract) is
//! the `versions` suite of `backend_suite!` (`tests/common/versions.rs`), which each
//! `tests/store_<backend>.rs` runs.

#![cfg(feature = "memory")]
// The database suites need the SQL stores; without them, what only they use is unused.
#![cfg_attr(
    not(all(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(unused)
)]

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
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::body::{RequestBody, ResponseBody};
use tower_idempotency::store::{MemoryStore, Resolution, Stale};
use tower_idempotency::version_guard::{self, VersionGuardError, VersionGuardLayer, VersionStore};
use tower_idempotency::{IdempotencyKey, MissingKey, Outcome, key};

use common::versions::{
    Harness, Shuffle, deliver_until_acknowledged, delivery, handler, order_layer, ordered,
    outcome_header,
};
use common::{key_in, unique_namespace};

/// Four handles on one database, each with a pool of its own.
macro_rules! four {
    ($make:expr) => {
        async {
            let mut stores = Vec::new();
            for _ in 0..4 {
                stores.push($make.await?);
            }
            Some(stores)
        }
    };
}

#[cfg(feature = "sqlite")]
async fn sqlite_store() -> Option<tower_idempotency::store::SqliteStore> {
    common::db::sqlite_file_store("order").await
}
#[cfg(feature = "mysql")]
async fn mysql_two_step() -> Option<tower_idempotency::store::MySqlStore> {
    let store = common::db::mysql_store().await?;
    Some(store.with_flavor(tower_idempotency::store::MySqlFlavor::MySql))
}

// ---- What the layer answers by itself (memory) ----

async fn problem<B: Body<Data = Bytes>>(res: Response<B>) -> serde_json::Value
where
    B::Error: Debug,
{
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

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
    assert_eq!(
        problem(res).await["expected"],
        "JSON field `/data/object/id`"
    );
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

// ---- Transactional mode: `version_guard::advance` in the delivery's transaction ----

/// Generates the transactional suite for one SQL backend: `$db` is its database, `$make` and
/// `$instances` as above, `$upsert` writes the business row (id, status, version) counting its
/// writes, `$select` reads (status, version, writes) by id.
macro_rules! advance_suite {
    ($module:ident, $feature:literal, $store:ty, $db:ty, $make:expr, $instances:expr,
     upsert: $upsert:literal, select: $select:literal) => {
        #[cfg(feature = $feature)]
        mod $module {
            use super::*;
            use tower_idempotency::transactional::{TransactionalLayer, TxHandle};
            use tower_idempotency::version_guard::Advance;

            const CREATE: &str = "CREATE TABLE IF NOT EXISTS order_subscriptions (\
                id VARCHAR(255) NOT NULL PRIMARY KEY, status VARCHAR(64) NOT NULL, \
                version BIGINT NOT NULL, writes BIGINT NOT NULL)";

            /// Transactional mode keyed by `x-event-id`; the handler advances the entity's
            /// version in the delivery's transaction and writes the business row only if it is
            /// newer, then behaves as `x-behave` says (`ok`, `slow`, `500` after its writes).
            fn service(
                store: $store,
                ns: &str,
            ) -> impl Service<
                Request<Full<Bytes>>,
                Response = Response<ResponseBody<Full<Bytes>>>,
                Error = Infallible,
                Future = impl Send,
            > + Clone
            + Send
            + 'static {
                let ns = ns.to_owned();
                let handler_store = store.clone();
                let handler_ns = ns.clone();
                TransactionalLayer::new(store)
                    .key(key::header("x-event-id").namespace(ns))
                    .lock_timeout(Duration::from_secs(10))
                    .layer(service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
                        let (store, ns) = (handler_store.clone(), handler_ns.clone());
                        async move {
                            let answer = |status: StatusCode, body: &'static str| {
                                let mut res =
                                    Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                                *res.status_mut() = status;
                                Ok::<_, Infallible>(res)
                            };
                            let behave = req.headers()["x-behave"].to_str().unwrap().to_owned();
                            let handle = req.extensions().get::<TxHandle<$db>>().unwrap().clone();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
                            let object = &event["data"]["object"];
                            let id = format!("{ns}/{}", object["id"].as_str().unwrap());
                            let status = object["status"].as_str().unwrap().to_owned();
                            let version = object["version"].as_i64().unwrap();
                            let entity =
                                IdempotencyKey::new(ns.clone(), object["id"].as_str().unwrap())
                                    .unwrap();

                            let mut tx = handle.lock().unwrap();
                            match version_guard::advance(&mut *tx, &store, &entity, version).await {
                                Ok(Advance::Applied) => {}
                                Ok(Advance::Outdated { .. }) => {
                                    return answer(StatusCode::OK, "outdated");
                                }
                                // A deadlock or lock timeout: the sender retries.
                                Err(_) => {
                                    return answer(
                                        StatusCode::INTERNAL_SERVER_ERROR,
                                        "advance failed",
                                    );
                                }
                            }
                            let written = sqlx::query($upsert)
                                .bind(&id)
                                .bind(&status)
                                .bind(version)
                                .execute(&mut *tx)
                                .await;
                            if written.is_err() {
                                return answer(StatusCode::INTERNAL_SERVER_ERROR, "write failed");
                            }
                            drop(tx);
                            match behave.as_str() {
                                "500" => answer(
                                    StatusCode::INTERNAL_SERVER_ERROR,
                                    "failed after writing",
                                ),
                                "slow" => {
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                    answer(StatusCode::OK, "applied")
                                }
                                _ => answer(StatusCode::OK, "applied"),
                            }
                        }
                    }))
            }

            async fn setup(store: &$store) {
                sqlx::query(CREATE).execute(store.pool()).await.unwrap();
            }

            async fn business(store: &$store, ns: &str, id: &str) -> Option<(String, i64, i64)> {
                sqlx::query_as($select)
                    .bind(format!("{ns}/{id}"))
                    .fetch_optional(store.pool())
                    .await
                    .unwrap()
            }

            async fn body_text(res: Response<ResponseBody<Full<Bytes>>>) -> String {
                let bytes = res.into_body().collect().await.unwrap().to_bytes();
                String::from_utf8(bytes.to_vec()).unwrap()
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn advance_reverse_order_newer_wins_and_a_500_rolls_back_both() {
                let Some(store) = $make.await else { return };
                setup(&store).await;
                let ns = unique_namespace("advance");
                let svc = service(store.clone(), &ns);
                let entity = key_in(&ns, "sub_1");

                let res = svc
                    .clone()
                    .oneshot(delivery("evt_2", "sub_1", "cancelled", 2, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(body_text(res).await, "applied");
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_1", "sub_1", "active", 1, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(body_text(res).await, "outdated");
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("cancelled".into(), 2, 1))
                );
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));

                // Another change with the same version under a new event id: it applies, as
                // the version guard runs it; the applied version stays.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_2b", "sub_1", "paused", 2, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(body_text(res).await, "applied");
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("paused".into(), 2, 2))
                );
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
                // A redelivery of that event is the marker's duplicate: the handler does not run.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_2b", "sub_1", "paused", 2, "ok"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                assert_eq!(outcome_header(&res), Some("duplicate"));
                // An older version under a new event id is outdated, nothing written.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_1b", "sub_1", "active", 1, "ok"))
                    .await
                    .unwrap();
                assert_eq!(body_text(res).await, "outdated");
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("paused".into(), 2, 2))
                );

                // A 500 after both writes: the version and the business row roll back together.
                let res = svc
                    .clone()
                    .oneshot(delivery("evt_3", "sub_1", "past_due", 3, "500"))
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(2));
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("paused".into(), 2, 2))
                );
                // The sender's retry applies it.
                let res = svc
                    .oneshot(delivery("evt_3", "sub_1", "past_due", 3, "ok"))
                    .await
                    .unwrap();
                assert_eq!(body_text(res).await, "applied");
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(3));
                assert_eq!(
                    business(&store, &ns, "sub_1").await,
                    Some(("past_due".into(), 3, 3))
                );
            }

            /// `advance` directly, in two transactions on the store's database: an equal
            /// version counts as advanced, and the entity's row keeps the second transaction
            /// waiting until the first ends; an older version is outdated.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn advance_equal_version_applies_one_transaction_at_a_time() {
                let Some(store) = $make.await else { return };
                let ns = unique_namespace("advance-equal");
                let entity = key_in(&ns, "sub_1");

                let mut tx = store.pool().begin().await.unwrap();
                assert_eq!(
                    version_guard::advance(&mut *tx, &store, &entity, 5)
                        .await
                        .unwrap(),
                    Advance::Applied
                );
                tx.commit().await.unwrap();

                let mut first = store.pool().begin().await.unwrap();
                assert_eq!(
                    version_guard::advance(&mut *first, &store, &entity, 5)
                        .await
                        .unwrap(),
                    Advance::Applied,
                    "an equal version advances"
                );
                let (second_store, second_entity) = (store.clone(), entity.clone());
                let mut second = tokio::spawn(async move {
                    let mut tx = second_store.pool().begin().await.unwrap();
                    let advanced =
                        version_guard::advance(&mut *tx, &second_store, &second_entity, 5)
                            .await
                            .unwrap();
                    tx.commit().await.unwrap();
                    advanced
                });
                assert!(
                    tokio::time::timeout(Duration::from_millis(300), &mut second)
                        .await
                        .is_err(),
                    "the second transaction waits for the entity's row"
                );
                first.commit().await.unwrap();
                assert_eq!(second.await.unwrap(), Advance::Applied);
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));

                let mut tx = store.pool().begin().await.unwrap();
                assert_eq!(
                    version_guard::advance(&mut *tx, &store, &entity, 4)
                        .await
                        .unwrap(),
                    Advance::Outdated { applied: 5 }
                );
                assert_eq!(
                    version_guard::advance(&mut *tx, &store, &entity, 6)
                        .await
                        .unwrap(),
                    Advance::Applied
                );
                tx.rollback().await.unwrap();
                assert_eq!(store.applied_version(&entity).await.unwrap(), Some(5));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn advance_sixteen_versions_in_random_order_over_four_instances() {
                let Some(stores) = $instances.await else {
                    return;
                };
                let stores: Vec<$store> = stores;
                setup(&stores[0]).await;
                let ns = unique_namespace("advance-random");
                let services: Vec<_> = stores.iter().map(|s| service(s.clone(), &ns)).collect();
                let mut versions: Vec<i64> = (1..=16).collect();
                let mut rng = Shuffle::seeded();
                let seed = rng.0;
                rng.shuffle(&mut versions);
                let tasks: Vec<_> = versions
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        let svc = services[i % services.len()].clone();
                        tokio::spawn(deliver_until_acknowledged(svc, move || {
                            delivery(
                                &format!("evt_{v}"),
                                "sub_1",
                                &format!("status-{v}"),
                                v,
                                "slow",
                            )
                        }))
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
                let context = format!("seed {seed}, order {versions:?}");
                let (status, version, writes) = business(&stores[0], &ns, "sub_1").await.unwrap();
                assert_eq!((status.as_str(), version), ("status-16", 16), "{context}");
                assert!((1..=16).contains(&writes), "{writes} writes ({context})");
                let entity = key_in(&ns, "sub_1");
                assert_eq!(
                    stores[0].applied_version(&entity).await.unwrap(),
                    Some(16),
                    "{context}"
                );
            }
        }
    };
}

advance_suite!(advance_sqlite, "sqlite", tower_idempotency::store::SqliteStore, sqlx::Sqlite,
    super::sqlite_store(), four!(super::sqlite_store()),
    upsert: "INSERT INTO order_subscriptions (id, status, version, writes) VALUES (?1, ?2, ?3, 1) \
             ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version, \
             writes = order_subscriptions.writes + 1",
    select: "SELECT status, version, writes FROM order_subscriptions WHERE id = ?1");

advance_suite!(advance_postgres, "postgres", tower_idempotency::store::PostgresStore, sqlx::Postgres,
    common::db::postgres_store(), four!(common::db::postgres_store()),
    upsert: "INSERT INTO order_subscriptions (id, status, version, writes) VALUES ($1, $2, $3, 1) \
             ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = excluded.version, \
             writes = order_subscriptions.writes + 1",
    select: "SELECT status, version, writes FROM order_subscriptions WHERE id = $1");

advance_suite!(advance_mysql, "mysql", tower_idempotency::store::MySqlStore, sqlx::MySql,
    common::db::mysql_store(), four!(common::db::mysql_store()),
    upsert: "INSERT INTO order_subscriptions (id, status, version, writes) VALUES (?, ?, ?, 1) \
             ON DUPLICATE KEY UPDATE status = VALUES(status), version = VALUES(version), \
             writes = writes + 1",
    select: "SELECT status, version, writes FROM order_subscriptions WHERE id = ?");

advance_suite!(advance_mysql_two_step, "mysql", tower_idempotency::store::MySqlStore, sqlx::MySql,
    super::mysql_two_step(), four!(super::mysql_two_step()),
    upsert: "INSERT INTO order_subscriptions (id, status, version, writes) VALUES (?, ?, ?, 1) \
             ON DUPLICATE KEY UPDATE status = VALUES(status), version = VALUES(version), \
             writes = writes + 1",
    select: "SELECT status, version, writes FROM order_subscriptions WHERE id = ?");

/// The version guard's former names (the module `order`, `OrderLayer`, `Order`,
/// `OrderError`) still build the same layer, for one release.
#[tokio::test]
#[allow(deprecated)]
async fn former_names_still_work() {
    use tower_idempotency::order::{self, Order, OrderError, OrderLayer};
    let store = MemoryStore::new();
    let svc: Order<_, _, _, _> = OrderLayer::new(store.clone())
        .entity(key::header("x-entity").namespace("acme"))
        .version(order::version::header("x-version"))
        .layer(service_fn(
            |_req: Request<RequestBody<Full<Bytes>>>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            },
        ));
    let send = |version: &str| {
        Request::post("/")
            .header("x-entity", "order_1")
            .header("x-version", version)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(send("2")).await.unwrap().status(),
        StatusCode::OK
    );
    let older = svc.clone().oneshot(send("1")).await.unwrap();
    assert_eq!(older.headers()["idempotency-outcome"], "outdated");
    let refused = svc.oneshot(Request::post("/").body(Full::new(Bytes::new())).unwrap());
    let refused = refused.await.unwrap();
    let error: Option<&OrderError> = refused.extensions().get();
    assert!(error.is_some_and(|e| e.is_missing()));
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
