//! Process each webhook once, however often it is delivered.
//!
//! Webhook senders deliver *at least once*: a sender that lost the response to a POST cannot
//! tell "the receiver crashed" from "the receiver finished and the 200 got lost", so it sends
//! again. [`IdempotencyLayer`] is a tower middleware that turns those duplicates into
//! exactly-once *processing*: it claims the sender's event id in a [`store`] before the
//! handler runs, commits it when the handler succeeds, and releases it when the handler fails,
//! so the sender's retry runs it again.
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
//! use http::{Request, Response, StatusCode};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let emails_sent = Arc::new(AtomicUsize::new(0));
//! let sent = emails_sent.clone();
//! let mut svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::github()))
//!     .service(service_fn(move |_req| {
//!         sent.fetch_add(1, Ordering::SeqCst); // the side effect
//!         async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }
//!     }));
//!
//! let delivery = || {
//!     Request::post("/webhooks/github")
//!         .header("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
//!         .body(String::new())
//!         .unwrap()
//! };
//! for _ in 0..3 {
//!     let res = svc.ready().await.unwrap().call(delivery()).await.unwrap();
//!     assert_eq!(res.status(), StatusCode::OK);
//! }
//! assert_eq!(emails_sent.load(Ordering::SeqCst), 1);
//! # }
//! ```
//!
//! # What every delivery gets
//!
//! | situation | answer | handler runs | row afterwards |
//! |---|---|---|---|
//! | first delivery, handler answers 2xx | the handler's response | yes | `done` |
//! | first delivery, handler answers non-2xx or `Err` | the handler's response / error | yes | none (released) |
//! | first delivery, handler panics or its future is dropped | the panic goes on / nothing | yes | released (reclaim), kept until stale (hold) |
//! | duplicate of a `done` key | 200, empty body, `idempotency-outcome: duplicate` | no | `done` |
//! | duplicate while the first is `processing` | 409 with `Retry-After` | no | `processing` |
//! | stale claim, policy reclaim | as a first delivery; the old owner is fenced off | yes | as above |
//! | stale claim, policy hold | 409, a warning and the [`on_held`](IdempotencyLayer::on_held) hook | no | `processing` |
//! | no key, or an empty, overlong or non-text key | 400 problem+json naming the expected key | no | none |
//! | body over the limit (body keys only) | 413 | no | none |
//! | body not JSON, field absent (body keys) | 400 | no | none |
//! | store failing | 503 with `Retry-After` | no | unchanged |
//! | commit fails after the handler succeeded | the handler's response, an error logged | yes | `processing` until stale |
//!
//! A duplicate of a finished event is answered 200, never 409: a sender treats 409 as a
//! failure and would retry what was already processed, forever. A duplicate of an event still
//! in flight is answered 409 because the first delivery may yet fail and need this retry.
//!
//! # Stale claims are a decision
//!
//! A process that dies between claim and commit leaves a `processing` row behind, and nobody
//! can know whether the side effect happened. [`Stale::reclaim_after`] (the default, after 15
//! minutes) runs the handler again: right for receipts and notifications, where a possible
//! duplicate beats a certain loss. [`Stale::hold_after`] leaves the row for a person and
//! answers 409: right for anything that moves money or goods.
//!
//! Every claim carries a fresh fencing token ([`store::LeaseToken`]); commit and release act
//! only while it holds, so a slow owner whose claim was reclaimed cannot overwrite the new
//! owner's row.
//!
//! # Tracing
//!
//! Each delivery with a key records one `DEBUG` event `delivery` with the fields `namespace`,
//! `key`, `outcome` and, when it held a claim, `lease`. Reclaims, held claims, lost leases and
//! store failures are logged at `WARN` or `ERROR`.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod body;
mod future;
pub mod key;
mod layer;
pub mod response;
mod service;
pub mod store;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub mod transactional;

pub use future::ResponseFuture;
pub use key::IdempotencyKey;
pub use layer::{DEFAULT_BODY_LIMIT, IdempotencyLayer, MissingKey};
pub use response::Outcome;
pub use service::Idempotency;
pub use store::{Stale, StalePolicy};

/// The README's examples, compiled and run as doc tests.
#[cfg(all(doctest, feature = "sqlite"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
