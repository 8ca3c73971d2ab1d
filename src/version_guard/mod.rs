//! Out-of-order delivery: a version guard per entity, and legal transitions.
//!
//! Retries with backoff let event #2 overtake event #1. A subscription set `active` at
//! 14:00:01 and `cancelled` at 14:00:03 ends up `active` when the first delivery failed and
//! came back five minutes later. Nothing was delivered twice, so deduplication cannot help; a
//! monotonic guard on the *sender's* version or timestamp can. [`VersionGuardLayer`] keeps the latest
//! version applied per entity and answers an older delivery 200 without running the handler;
//! a delivery of the same version runs (see [equal versions](#equal-versions)).
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//!
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::body::RequestBody;
//! use tower_idempotency::{key, version_guard::{self, VersionGuardLayer}, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // The business state: subscription id -> status, written without any check of its own.
//! let statuses = Arc::new(Mutex::new(HashMap::<String, String>::new()));
//! let db = statuses.clone();
//! let mut svc = ServiceBuilder::new()
//!     .layer(
//!         VersionGuardLayer::new(MemoryStore::new())
//!             .entity(key::json("/data/object/id").namespace("subscription"))
//!             .version(version_guard::version::json("/data/object/updated_at")),
//!     )
//!     .service(service_fn(move |req: Request<RequestBody<Full<Bytes>>>| {
//!         let db = db.clone();
//!         async move {
//!             let body = req.into_body().collect().await?.to_bytes();
//!             let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
//!             let object = &event["data"]["object"];
//!             let (id, status) = (object["id"].as_str().unwrap(), object["status"].as_str().unwrap());
//!             db.lock().unwrap().insert(id.to_owned(), status.to_owned());
//!             Ok::<_, tower_idempotency::body::BoxError>(Response::new(Full::new(Bytes::new())))
//!         }
//!     }));
//!
//! let event = |status: &str, updated_at: &str| {
//!     let json = serde_json::json!({"data": {"object": {
//!         "id": "sub_1", "status": status, "updated_at": updated_at,
//!     }}});
//!     Request::post("/webhooks/billing").body(Full::new(Bytes::from(json.to_string()))).unwrap()
//! };
//! // The cancellation arrives first...
//! let res = svc.ready().await.unwrap().call(event("cancelled", "2024-05-01T14:00:03Z")).await.unwrap();
//! assert_eq!(res.status(), StatusCode::OK);
//! // ...then the retry of the activation, five minutes late: acknowledged, not applied.
//! let res = svc.ready().await.unwrap().call(event("active", "2024-05-01T14:00:01Z")).await.unwrap();
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.headers()["idempotency-outcome"], "outdated");
//! assert_eq!(statuses.lock().unwrap()["sub_1"], "cancelled");
//! # }
//! ```
//!
//! # Entity and version
//!
//! The entity is what the event changes: a subscription, an order. Its id is extracted like an
//! idempotency key ([`key::json`](crate::key::json), [`key::header`](crate::key::header),
//! closures, …) and namespaced, so ids of different kinds of entity never meet. Unlike event
//! keys, entities are not scoped per route by default: an entity is one entity on every
//! endpoint, so its events are ordered whichever route they arrive on (see
//! [`VersionGuardLayer::new`]). The version is
//! the sender's: a revision counter, or the change's timestamp ([`version`] reads JSON
//! integers, RFC 3339 strings and headers). **Never the receiver's clock**: a late retry is
//! received late, but it is still old. An event that carries neither a revision nor a change
//! time cannot be ordered by this layer: fetch the entity's current state from the sender's API
//! instead of applying the event's copy.
//!
//! # What every delivery gets
//!
//! | situation | answer | handler runs | the entity's versions afterwards |
//! |---|---|---|---|
//! | version newer than or equal to the applied one, nothing pending, handler answers 2xx | the handler's response | yes | applied = this version (an equal one: unchanged) |
//! | the same, handler answers non-2xx, `Err`, or panics | the handler's response / error | yes | unchanged, pending slot released (hold policy: a panic leaves it to turn stale) |
//! | the same, the sender hangs up while the handler runs | nobody hears it | yes, to completion | as the handler answers |
//! | version older than the applied one (a late retry) | **200**, empty body, `idempotency-outcome: outdated` | no | unchanged |
//! | another version of the entity, or another delivery of the same version, is being applied | **409** with `Retry-After` (outcome `in-flight`) | no | unchanged |
//! | that other version is stale (its owner stopped renewing it: its process died), policy reclaim | as a first delivery | yes | as above |
//! | that other version is stale, policy hold | **409**, a warning and the [`on_held`](VersionGuardLayer::on_held) hook | no | held until [`VersionStore::resolve_version`] |
//! | `.verify(..)` set, and the signature is missing, wrong or too old | **401** problem+json | no | unchanged: nothing was claimed |
//! | no entity id or no version | **400** problem+json naming what was expected (or run unordered: [`VersionGuardLayer::missing_key`]) | no | unchanged |
//! | invalid entity id or version, body not JSON | **400** | no | unchanged |
//! | body over the limit / too slow (body extractors only) | **413** / **408** | no | unchanged |
//! | header extractors, and the body does not arrive within `body_timeout` | reading it fails: the handler's own answer (an axum extractor's 400), or **408** where the handler answered success | yes | unchanged, pending slot released |
//! | store failing, or the layer draining | **503** with `Retry-After` | no | unchanged |
//!
//! Why 409 for a busy entity: two versions of one entity running at once could let the older
//! one finish last. The second waits; its sender retries it after `Retry-After`, by which time
//! it is either applied in order or outdated.
//!
//! # Equal versions
//!
//! Only a version **older** than the applied one is outdated; a version **equal** to it runs,
//! taking the pending slot like a newer one (one delivery at a time: a second delivery of that
//! version meanwhile is answered 409). Versions are often timestamps with a resolution of a
//! second (Stripe's `created`): two different changes of one entity within the same second
//! carry the same version, and dropping the second as outdated would lose it for good.
//!
//! The price: **a version guard used alone runs a redelivery of the latest version again**
//! (the sender's retry of an event already applied, or the same change re-sent under a new
//! event id). Stack [`IdempotencyLayer`](crate::IdempotencyLayer) outside it
//! ([below](#with-deduplication)) so that redeliveries of an event are answered as duplicates
//! before they reach this layer, and write handlers so that applying the latest state twice is
//! harmless. Where the sender has a finer version, use it: a revision counter, or a sub-second
//! timestamp ([`version::parse_timestamp`] keeps microseconds); then equal versions are rare,
//! and mean the same change.
//!
//! # With deduplication
//!
//! Put [`IdempotencyLayer`](crate::IdempotencyLayer) outside and `VersionGuardLayer` inside:
//! duplicates of an event are answered by the first, and only first deliveries take the
//! entity's pending slot. This is what keeps a redelivery of the latest version from running
//! again ([equal versions](#equal-versions) run). An outdated delivery is a 2xx, so its event
//! key is committed and its later duplicates are answered `duplicate`.
//!
//! ```
//! # use tower_idempotency::{IdempotencyLayer, key, version_guard::{self, VersionGuardLayer}, store::MemoryStore};
//! # let store = MemoryStore::new();
//! let stack = tower::ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(store.clone()).key(key::stripe()))
//!     .layer(
//!         VersionGuardLayer::new(store)
//!             .entity(key::json("/data/object/id").namespace("stripe-subscription"))
//!             .version(version_guard::version::json("/data/object/updated_at")),
//!     );
//! # let _ = stack;
//! ```
//!
//! In transactional mode, use `advance` ([below](#ordering-in-transactional-mode)) inside the
//! handler's transaction instead of this layer, which records versions outside that
//! transaction.
//!
//! Two things to know about the stack:
//!
//! - With body extractors in both layers, the body is buffered twice (once by each layer, each
//!   through its own limit); the handler still receives it intact.
//! - The response's extensions keep the [`Outcome`](crate::Outcome) `VersionGuardLayer` gave
//!   (`Outdated`, `InFlight`, ...): the more specific answer. The outer layer still commits the
//!   key of an outdated delivery, so its retries are duplicates.
//!
//! # Store
//!
//! Every store implements [`VersionStore`]. The SQL stores keep one row per entity in the table
//! `<table>_versions` (`idempotency_keys_versions` by default), created by their `migrate()`
//! next to the claims table. Each backend's documentation shows its SQL: beginning a version is
//! one atomic upsert (one round trip on PostgreSQL, SQLite and MariaDB; on MySQL one for a new
//! entity and two otherwise), commit and release one conditional `UPDATE` each.
//!
//! # Ordering in transactional mode
//!
//! When the business change is a write to the store's database, the guard belongs in the same
//! transaction: `advance` moves the entity's applied version inside the transaction of
//! transactional mode (`tower_idempotency::transactional`, or any transaction on the store's
//! database) and answers whether the delivery is newer. The version and the business write then commit or
//! roll back together, and the entity's row stays locked until the transaction ends, so
//! concurrent versions of one entity apply one after the other. As in the layer, only an older
//! version is outdated: an equal one answers [`Advance::Applied`]. Transactional mode's marker
//! answers a redelivery of the same event as a duplicate before the handler runs; the same
//! version under a new event id applies again. Per backend:
//!
//! - PostgreSQL, SQLite: `INSERT … ON CONFLICT (namespace, entity) DO UPDATE SET
//!   applied_version = excluded.applied_version WHERE t.applied_version IS NULL OR
//!   t.applied_version <= excluded.applied_version RETURNING applied_version`; one round trip
//!   when it applies, a second (`SELECT`) to report the applied version when outdated.
//! - MariaDB: `INSERT … ON DUPLICATE KEY UPDATE` that moves the version and stamps it with a
//!   fresh token unless the row is at a newer version, `RETURNING` both; one round trip.
//! - MySQL: the same upsert without `RETURNING`, then a `SELECT … FOR UPDATE` unless the row was
//!   new; one or two round trips.
#![cfg_attr(
    all(feature = "postgres", feature = "axum"),
    doc = r#"
```no_run
use axum::{Router, extract::State, http::StatusCode, routing::post};
use sqlx::Postgres;
use tower_idempotency::version_guard::{self, Advance};
use tower_idempotency::{IdempotencyKey, key, store::PostgresStore, transactional::{TransactionalLayer, Tx}};

async fn subscription_updated(
    State(store): State<PostgresStore>,
    mut tx: Tx<Postgres>,
    body: String,
) -> Result<&'static str, StatusCode> {
    let event: serde_json::Value = serde_json::from_str(&body).map_err(|_| StatusCode::BAD_REQUEST)?;
    let object = &event["data"]["object"];
    let id = object["id"].as_str().ok_or(StatusCode::BAD_REQUEST)?;
    let updated_at = object["updated_at"].as_str().ok_or(StatusCode::BAD_REQUEST)?;
    let version = version_guard::version::parse_timestamp(updated_at).map_err(|_| StatusCode::BAD_REQUEST)?;
    let entity = IdempotencyKey::new("subscription", id).map_err(|_| StatusCode::BAD_REQUEST)?;
    let failed = StatusCode::INTERNAL_SERVER_ERROR;

    // In the delivery's transaction: committed with the status below, or not at all.
    let advanced = version_guard::advance(&mut *tx, &store, &entity, version).await.map_err(|_| failed)?;
    if let Advance::Outdated { .. } = advanced {
        return Ok("outdated"); // 2xx: a newer state is in already
    }
    sqlx::query("UPDATE subscriptions SET status = $1 WHERE id = $2")
        .bind(object["status"].as_str())
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(|_| failed)?;
    Ok("applied")
}

# async fn run() -> Result<(), Box<dyn std::error::Error>> {
let store = PostgresStore::new(sqlx::PgPool::connect("postgres://localhost/app").await?);
store.migrate().await?;
let app: Router = Router::new()
    .route(
        "/webhooks/billing",
        post(subscription_updated)
            .layer(TransactionalLayer::new(store.clone()).key(key::header("webhook-id"))),
    )
    .with_state(store);
# Ok(())
# }
```
"#
)]
//!
//! ## Without a versions table
//!
//! When the entity's own row carries the sender's version, guard your own `UPDATE` with it; no
//! version table is needed, in any mode:
//!
//! ```sql
//! UPDATE subscriptions SET status = $1, updated_at = $2
//! WHERE id = $3 AND updated_at <= $2
//! ```
//!
//! Zero rows changed means the row is at a newer version (or absent: insert it with `INSERT …
//! ON CONFLICT (id) DO UPDATE … WHERE subscriptions.updated_at <= excluded.updated_at`).
//! `<=`, as the layer does, applies a second change with the same timestamp instead of losing
//! it (and applies a redelivery of the latest one again: let the marker of
//! transactional mode answer those). With a revision counter, which
//! never repeats for two changes, `<` is safe and refuses a redelivery too. `updated_at` is the
//! sender's timestamp from the event, bound as a parameter: never `now()`.
//!
//! # Legal transitions
//!
//! A version guard puts an entity's changes in order; a [`Lifecycle`] refuses changes that no
//! order makes legal (`expired → active`). Check the transition in the handler, against the
//! entity's current state, and answer the [`IllegalTransition`] instead of applying it; its
//! documentation discusses when to answer non-2xx (the sender retries) and when 2xx with an
//! alert.

#[cfg(feature = "_sql")]
mod advance;
mod error;
mod layer;
mod lifecycle;
mod mode;
pub mod version;

#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use crate::store::AdvanceVersion;
/// The version store's part lives with the stores; these are its names here as well.
pub use crate::store::{Advance, PendingVersion, VersionClaim, VersionLease, VersionStore, decide};
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use advance::advance;
pub use error::VersionGuardError;
pub use layer::{Unset, VersionGuard, VersionGuardLayer};
pub use lifecycle::{IllegalTransition, Lifecycle};
pub use mode::VersionMode;
pub use version::ExtractVersion;
