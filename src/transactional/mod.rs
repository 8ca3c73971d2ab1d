//! Transactional mode: the marker and the handler's own writes commit together.
//!
//! When the work a webhook triggers is itself a write to the same database (mark an order
//! paid, insert a row), claim and commit can be one database transaction: the layer begins
//! it, inserts the key's marker in it, hands it to the handler, and commits it only after a
//! successful response. A handler that fails or panics rolls everything back, marker included,
//! so the sender's retry runs it again. A handler whose sender hung up runs on to its end, and
//! its answer decides as usual. There is no `processing` row and so no stale claim to decide
//! about: a crash rolls back.
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use http::{Request, Response, StatusCode};
//! use sqlx::{Sqlite, SqlitePool, sqlite::SqlitePoolOptions};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::body::RequestBody;
//! use tower_idempotency::store::{KeyState, SqliteStore, Store};
//! use tower_idempotency::transactional::{TransactionalLayer, TxHandle};
//! use tower_idempotency::{IdempotencyKey, key};
//!
//! // SQLite in memory, for the example: one connection that the pool keeps open.
//! let pool = SqlitePoolOptions::new()
//!     .max_connections(1)
//!     .min_connections(1)
//!     .idle_timeout(None)
//!     .max_lifetime(None)
//!     .connect("sqlite::memory:")
//!     .await?;
//! sqlx::query("CREATE TABLE payments (event TEXT NOT NULL)").execute(&pool).await?;
//! let store = SqliteStore::new(pool.clone());
//! store.migrate().await?;
//!
//! // The handler records the payment in the delivery's transaction, then answers 500 if the
//! // delivery asks it to fail (its next step went wrong, say).
//! let svc = ServiceBuilder::new()
//!     .layer(TransactionalLayer::new(store.clone()).key(key::header("x-event-id").namespace("payments")))
//!     .service(service_fn(|req: Request<RequestBody<String>>| async move {
//!         let handle = req.extensions().get::<TxHandle<Sqlite>>().expect("under the layer").clone();
//!         let mut tx = handle.lock().expect("open while the handler runs");
//!         sqlx::query("INSERT INTO payments (event) VALUES (?)")
//!             .bind(req.headers()["x-event-id"].to_str().unwrap_or_default())
//!             .execute(&mut *tx)
//!             .await?;
//!         let fail = req.headers().contains_key("x-fail");
//!         let status = if fail { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::OK };
//!         Ok::<_, sqlx::Error>(Response::builder().status(status).body(String::new()).unwrap())
//!     }));
//! let delivery = |fail: bool| {
//!     let req = Request::post("/webhooks/payments").header("x-event-id", "evt_1");
//!     let req = if fail { req.header("x-fail", "yes") } else { req };
//!     req.body(String::new())
//! };
//! async fn payments(pool: &SqlitePool) -> Result<i64, sqlx::Error> {
//!     sqlx::query_scalar("SELECT COUNT(*) FROM payments").fetch_one(pool).await
//! }
//! let marker = IdempotencyKey::new("payments", "evt_1")?; // no router, so no scope
//!
//! // The handler wrote its row, then answered 500: the row and the marker are rolled back
//! // together, and the key is free for the sender's retry.
//! let res = svc.clone().oneshot(delivery(true)?).await?;
//! assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
//! assert_eq!(payments(&pool).await?, 0);
//! assert!(store.describe(&marker).await?.is_none());
//!
//! // The retry succeeds: its row and the marker commit together...
//! let res = svc.clone().oneshot(delivery(false)?).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(payments(&pool).await?, 1);
//! assert_eq!(store.describe(&marker).await?.map(|record| record.state), Some(KeyState::Done));
//!
//! // ...so a redelivery is a duplicate: 200, and the handler does not run again.
//! let res = svc.oneshot(delivery(false)?).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.headers()["idempotency-outcome"], "duplicate");
//! assert_eq!(payments(&pool).await?, 1);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```
//!
//! With axum, a handler takes the transaction as an argument, [`Tx`] (feature `axum`):
//!
//! ```no_run
//! # #[cfg(all(feature = "postgres", feature = "axum"))] {
//! use axum::{Router, http::StatusCode, routing::post};
//! use sqlx::Postgres;
//! use tower_idempotency::{key, store::PostgresStore, transactional::{TransactionalLayer, Tx}};
//!
//! async fn order_paid(mut tx: Tx<Postgres>, body: String) -> Result<&'static str, StatusCode> {
//!     let event: serde_json::Value = serde_json::from_str(&body).map_err(|_| StatusCode::BAD_REQUEST)?;
//!     let order = event["data"]["object"]["metadata"]["order_id"].as_str().unwrap_or_default();
//!     // Runs in the layer's transaction: committed with the marker, or not at all.
//!     sqlx::query("UPDATE orders SET status = 'paid' WHERE id = $1")
//!         .bind(order)
//!         .execute(&mut *tx)
//!         .await
//!         .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
//!     Ok("paid")
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::new(sqlx::PgPool::connect("postgres://localhost/app").await?);
//! store.migrate().await?;
//! let app: Router = Router::new().route(
//!     "/webhooks/stripe",
//!     post(order_paid).layer(TransactionalLayer::new(store).key(key::stripe())),
//! );
//! # Ok(())
//! # }
//! # }
//! ```
//!
//! # When to choose it
//!
//! Choose it when the handler's work is writes to the database the store lives in: it is the
//! correct default then. Do not choose it for work no transaction can roll back (an e-mail, a
//! third-party API call): a rollback after such a call would let the retry repeat it. Use the
//! claim-then-commit mode of [`IdempotencyLayer`](crate::IdempotencyLayer) for those.
//!
//! The transaction holds a pooled connection for as long as the handler runs; size the pool
//! for the deliveries you handle at once. The body is read whole before the transaction
//! begins (within the body limit and time limit), so a slow upload holds no connection.
//!
//! # Concurrent duplicates
//!
//! A duplicate that arrives while the first delivery's transaction is open waits on the
//! table's unique index. When the first commits, the duplicate answers 200; when it rolls
//! back, the duplicate runs the handler itself. The wait is bounded by
//! [`TransactionalLayer::lock_timeout`] (5 seconds by default): past it the duplicate answers
//! 409 with `Retry-After`. Each backend's store documents how it bounds the wait.
//!
//! On SQLite, which has one writer at a time, every delivery in this mode takes the write lock
//! when it begins, so deliveries run one after another whatever their key, and any of them
//! may answer 409 past the lock timeout when handlers are slow.
//!
//! A handler must not swallow its database errors: a failed statement aborts the transaction
//! on PostgreSQL (the layer notices before `COMMIT` and answers 503, so the retry runs), and a
//! MySQL deadlock rolls it back, marker included. The connection is then back in autocommit:
//! each statement a handler runs after ignoring the deadlock commits on its own, outside the
//! delivery. The layer still finds the marker gone and answers 503, but those writes stay and
//! the sender's retry makes them again. Return the error instead (a 5xx, so the sender
//! retries).
//!
//! To keep entities in order in this mode, move the version inside the transaction with
//! [`version_guard::advance`](crate::version_guard::advance), not with a `VersionGuardLayer` around the route: that
//! layer records versions on a connection of its own, outside the transaction.
//!
//! # What every delivery gets
//!
//! | situation | answer | marker and the handler's writes |
//! |---|---|---|
//! | handler answers 2xx | its response | committed together |
//! | handler answers non-2xx, `Err`, or panics | its response / error | rolled back |
//! | the sender hangs up while the handler runs | nobody hears it; the handler runs to its end | committed or rolled back as it answers |
//! | the process dies mid-handler | — | rolled back by the database |
//! | a statement of the handler failed and it answered 2xx anyway, or the commit fails | 503 with `Retry-After` | rolled back (a commit that timed out may have landed: the retry then finds the marker) |
//! | duplicate of a committed event | 200, `idempotency-outcome: duplicate` | unchanged |
//! | duplicate while the first is open, past the lock timeout | 409 with `Retry-After` | unchanged |
//! | store unreachable | 503 with `Retry-After`, the handler does not run | unchanged |
//! | the layer is draining ([`Drain`](crate::Drain)) | 503 with `Retry-After` | unchanged |
//! | `.verify(..)` set, and the signature is missing, wrong or too old | **401** problem+json | no transaction begun |
//!
//! Key errors are answered as in claim-then-commit mode.

mod layer;
mod mode;
mod tx;

/// The store's part of transactional mode lives with the stores; these are its names here as well.
pub use crate::store::{Begin, TransactionalStore};
pub use layer::{Transactional, TransactionalLayer};
pub use mode::TxMode;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use tx::MissingTransaction;
pub use tx::{Tx, TxHandle};
