//! Transactional mode's own behaviour: the axum `Tx` extractor, a transaction of another
//! database than the route's, an aborted transaction, a stalled upload.
//!
//! What every SQL backend promises of it (the marker and the handler's own write commit
//! together or not at all) is the `transactional` suite of `backend_suite!`
//! (`tests/common/transactional.rs`), which each `tests/store_<backend>.rs` runs.

#![cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
// Each test here needs PostgreSQL, or SQLite and axum; without them, what only they use is
// unused.
#![cfg_attr(
    not(all(feature = "postgres", feature = "sqlite", feature = "axum")),
    allow(unused)
)]

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::body::RequestBody;
use tower_idempotency::transactional::TransactionalLayer;
use tower_idempotency::{Outcome, key};

use common::transactional::{delivery, outcome};

/// The axum extractor: a handler takes `Tx<Sqlite>` and writes through it.
#[cfg(all(feature = "sqlite", feature = "axum"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_handler_writes_through_the_tx_extractor() {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use sqlx::Sqlite;
    use tower_idempotency::transactional::Tx;

    async fn paid(mut tx: Tx<Sqlite>, body: String) -> Result<&'static str, StatusCode> {
        let event: serde_json::Value =
            serde_json::from_str(&body).map_err(|_| StatusCode::BAD_REQUEST)?;
        sqlx::query("INSERT INTO tx_effects (event) VALUES (?1)")
            .bind(event["id"].as_str().unwrap_or_default().to_owned())
            .execute(&mut *tx)
            .await
            .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
        Ok("paid")
    }

    let store = common::db::sqlite_file_store("transactional")
        .await
        .unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS tx_effects (event VARCHAR(255) NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let app = Router::new()
        .route(
            "/stripe",
            post(paid).layer(TransactionalLayer::new(store.clone()).key(key::stripe())),
        )
        .route("/unguarded", post(paid));
    let id = common::unique_namespace("evt");
    let event = format!(r#"{{"id":"{id}","type":"charge.succeeded"}}"#);
    let send = |uri: &str| Request::post(uri).body(Body::from(event.clone())).unwrap();

    let first = app.clone().oneshot(send("/stripe")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let again = app.clone().oneshot(send("/stripe")).await.unwrap();
    assert_eq!(again.headers()["idempotency-outcome"], "duplicate");
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tx_effects WHERE event = ?1")
        .bind(&id)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(count, 1);

    // A route that asks for the transaction without the layer is a server error, not a panic,
    // and says so.
    let res = app.oneshot(send("/unguarded")).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let problem = problem_detail(res).await;
    assert!(problem.contains("no transactional"), "{problem}");
}

/// The `detail` of a problem+json response.
async fn problem_detail(res: axum::response::Response) -> String {
    let problem = common::problem(res).await;
    problem["detail"].as_str().unwrap().to_owned()
}

/// A handler that asks for a transaction on another database than the route's store gets a
/// problem+json 500 naming both, and the delivery is released, not committed.
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "axum"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_of_another_database_is_named_in_the_500() {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::post;
    use tower_idempotency::transactional::Tx;

    async fn wrong(_tx: Tx<sqlx::Postgres>) -> &'static str {
        "unreachable"
    }

    let store = common::db::sqlite_file_store("transactional")
        .await
        .unwrap();
    let app = Router::new().route(
        "/hook",
        post(wrong).layer(
            TransactionalLayer::new(store.clone())
                .key(key::header("x-event-id").namespace("tx-db")),
        ),
    );
    let id = common::unique_namespace("evt");
    let send = || {
        Request::post("/hook")
            .header("x-event-id", id.as_str())
            .body(Body::empty())
            .unwrap()
    };
    let res = app.clone().oneshot(send()).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let detail = problem_detail(res).await;
    assert!(
        detail.contains("Postgres") && detail.contains("Sqlite"),
        "{detail}"
    );
    // Not committed: the retry is not a duplicate.
    let again = app.oneshot(send()).await.unwrap();
    assert_eq!(again.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

/// A handler that swallows a failed statement and answers 200 leaves an aborted transaction,
/// which PostgreSQL turns into a silent rollback at COMMIT: the layer must not report success.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_transaction_is_not_reported_as_processed() {
    use tower_idempotency::transactional::TxHandle;

    let Some(store) = common::db::postgres_store().await else {
        return;
    };
    let ns = common::unique_namespace("tx-aborted");
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = runs.clone();
    let svc = TransactionalLayer::new(store.clone())
        .key(key::header("x-event-id").namespace(ns.clone()))
        .layer(service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
            let seen = seen.clone();
            async move {
                let first = seen.fetch_add(1, Ordering::SeqCst) == 0;
                let handle = req
                    .extensions()
                    .get::<TxHandle<sqlx::Postgres>>()
                    .unwrap()
                    .clone();
                let mut tx = handle.lock().unwrap();
                if first {
                    // A best-effort statement fails and the handler carries on regardless.
                    let failed = sqlx::query("SELECT 1 / 0").execute(&mut *tx).await;
                    assert!(failed.is_err());
                }
                Ok::<_, sqlx::Error>(Response::new(Full::new(Bytes::new())))
            }
        }));

    let res = svc.clone().oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "not a 2xx: nothing was committed"
    );
    assert_eq!(outcome(&res), Outcome::StoreUnavailable);
    let markers: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_keys WHERE namespace = $1")
            .bind(&ns)
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(markers, 0);

    // The sender's retry runs the handler again, and this time it commits.
    let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(outcome(&res), Outcome::Processed);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A body that never arrives: an upload stalled half way.
struct Stalled;

impl http_body::Body for Stalled {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        std::task::Poll::Pending
    }
}

/// Transactional mode reads the body before it begins: with a header key and a pool of one
/// connection, a stalled upload is answered 408 and never holds the connection, so another
/// delivery meanwhile goes through.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_upload_holds_no_connection() {
    use http_body_util::BodyExt;
    use http_body_util::combinators::BoxBody;

    let url = common::db::postgres_url();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(1))
        .connect(&url);
    let Some(pool) = common::connect("POSTGRES_URL", &url, pool).await else {
        return;
    };
    let store = tower_idempotency::store::PostgresStore::new(pool);
    store.migrate().await.unwrap();
    let ns = common::unique_namespace("tx-slow-upload");
    let svc = TransactionalLayer::new(store)
        .key(key::header("x-event-id").namespace(ns))
        .body_timeout(Duration::from_secs(2))
        .layer(service_fn(
            |req: Request<RequestBody<BoxBody<Bytes, Infallible>>>| async move {
                // A handler reads its body; here it is already whole.
                let body = req.into_body().collect().await.unwrap().to_bytes();
                Ok::<_, Infallible>(Response::new(Full::new(body)))
            },
        ));
    let request = |id: &str, body: BoxBody<Bytes, Infallible>| {
        Request::post("/hook")
            .header("x-event-id", id)
            .body(body)
            .unwrap()
    };
    let stalled = tokio::spawn(svc.clone().oneshot(request("slow", Stalled.boxed())));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let res = svc
        .oneshot(request(
            "fast",
            Full::new(Bytes::from_static(b"{}")).boxed(),
        ))
        .await
        .unwrap();
    assert_eq!(
        outcome(&res),
        Outcome::Processed,
        "the only connection was free"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    let res = stalled.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
}

/// Transactional mode reads the whole body before it begins, within the body timeout, so a
/// header-keyed delivery whose body stalls never opens a transaction or holds its key: it is
/// answered 408, and the genuine delivery of the same event then runs.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_body_holds_no_key() {
    use http_body_util::BodyExt;
    use http_body_util::combinators::BoxBody;

    let store = common::db::sqlite_file_store("transactional")
        .await
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let svc = TransactionalLayer::new(store)
        .key(key::header("x-event-id").namespace(common::unique_namespace("tx-stall")))
        .body_timeout(Duration::from_millis(200))
        .layer(service_fn(
            move |_req: Request<RequestBody<BoxBody<Bytes, Infallible>>>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
            },
        ));
    let request = |body: BoxBody<Bytes, Infallible>| {
        Request::post("/hook")
            .header("x-event-id", "evt_1")
            .body(body)
            .unwrap()
    };
    let res = svc.clone().oneshot(request(Stalled.boxed())).await.unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let genuine = Full::new(Bytes::from_static(b"{}")).boxed();
    let res = svc.oneshot(request(genuine)).await.unwrap();
    assert_eq!(outcome(&res), Outcome::Processed);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A store whose `begin` panics: the delivery is answered 503, as for a store that errs, and
/// the handler never runs. Every other call is the SQLite store's.
#[cfg(feature = "sqlite")]
#[derive(Clone)]
struct PanicsOnBegin(tower_idempotency::store::SqliteStore);

#[cfg(feature = "sqlite")]
mod panics_on_begin {
    use std::time::Duration;

    use sqlx::{Sqlite, SqliteConnection};
    use tower_idempotency::IdempotencyKey;
    use tower_idempotency::store::{
        Begin, Claim, KeyRecord, Lease, LeaseToken, Receipt, Resolution, Stale, Store, StoreError,
        StuckClaim, TransactionalStore,
    };

    use super::PanicsOnBegin;

    impl Store for PanicsOnBegin {
        async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
            self.0.claim(key, stale).await
        }
        async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
            self.0.renew(lease).await
        }
        async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
            self.0.commit(lease).await
        }
        async fn commit_with(&self, lease: &Lease, receipt: &Receipt) -> Result<(), StoreError> {
            self.0.commit_with(lease, receipt).await
        }
        async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
            self.0.release(lease).await
        }
        async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
            self.0.give_back(lease).await
        }
        async fn describe(&self, key: &IdempotencyKey) -> Result<Option<KeyRecord>, StoreError> {
            self.0.describe(key).await
        }
        async fn stuck_claims(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
            self.0.stuck_claims(older_than).await
        }
        async fn resolve(&self, key: &IdempotencyKey, how: Resolution) -> Result<bool, StoreError> {
            self.0.resolve(key, how).await
        }
        async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
            self.0.purge_completed(older_than).await
        }
    }

    impl TransactionalStore for PanicsOnBegin {
        type Database = Sqlite;

        async fn begin(
            &self,
            _key: &IdempotencyKey,
            _lock_timeout: Duration,
        ) -> Result<Begin<Sqlite>, StoreError> {
            panic!("a store bug while beginning")
        }

        async fn holds_marker(
            &self,
            conn: &mut SqliteConnection,
            key: &IdempotencyKey,
            token: LeaseToken,
        ) -> Result<bool, StoreError> {
            self.0.holds_marker(conn, key, token).await
        }
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_panics_while_beginning_is_answered_503() {
    let store = common::db::sqlite_file_store("transactional-panics")
        .await
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = runs.clone();
    let svc = TransactionalLayer::new(PanicsOnBegin(store))
        .key(key::header("x-event-id").namespace("tx-panics"))
        .layer(service_fn(
            move |_req: Request<RequestBody<Full<Bytes>>>| {
                seen.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
            },
        ));
    let res = svc.oneshot(delivery("e1", "ok")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(outcome(&res), Outcome::StoreUnavailable);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the handler never runs without a claim"
    );
}
