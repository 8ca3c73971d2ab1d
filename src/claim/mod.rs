//! Claim-then-commit, the layer's main mode: claim the event's key, run the handler, commit
//! on success, release on failure.
//!
//! [`IdempotencyLayer`] builds it, [`Idempotency`] is its service, and [`ClaimMode`] what the
//! service does with each delivery. The [crate documentation](crate) says what every delivery
//! gets; this is the whole of it in one request and its duplicate:
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::github()))
//!     .service(service_fn(|_req: Request<_>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(String::from("processed")))
//!     }));
//! let delivery = || {
//!     Request::post("/webhooks/github")
//!         .header("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
//!         .body(String::new())
//!         .unwrap()
//! };
//! let first = svc.clone().oneshot(delivery()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::OK);
//! let again = svc.oneshot(delivery()).await.unwrap();
//! assert_eq!(again.status(), StatusCode::OK);
//! assert_eq!(again.headers()["idempotency-outcome"], "duplicate"); // the handler did not run
//! # }
//! ```

mod layer;
mod mode;

pub use layer::{Idempotency, IdempotencyLayer};
pub use mode::ClaimMode;
