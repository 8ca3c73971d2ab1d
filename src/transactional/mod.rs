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
//! ```no_run
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
mod service;
mod tx;

/// The store's part of transactional mode lives with the stores; these are its names here as well.
pub use crate::store::{Begin, TransactionalStore};
pub use layer::TransactionalLayer;
pub use service::{Transactional, TransactionalService};
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use tx::MissingTransaction;
pub use tx::{Tx, TxHandle};
