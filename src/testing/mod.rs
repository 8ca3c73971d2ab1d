//! A kit for the tests of a receiver (feature `testing`, for `[dev-dependencies]`): signed
//! deliveries, and an at-least-once sender that plays the scenarios that find the real bugs
//! against the app.
//!
//! Sending one webhook and checking the result finds none of them. What does: the same event
//! twice in a row; the same event several times **at once**, on several instances of the
//! app (the test that finds a missing unique index); two events in reverse order; a sender
//! that hangs up while the handler runs and sends again. This crate passes them for itself;
//! the kit plays them against an app, counting its side effects in its own table:
//!
//! ```
//! # #[cfg(all(feature = "memory", feature = "axum"))] {
//! use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
//! use axum::{Router, routing::post};
//! use tower_idempotency::testing::{Scenario, Sender, sign};
//! use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore, verify};
//!
//! const SECRET: &str = "whsec_test";
//!
//! /// The app: a Stripe route whose side effect is counted in `receipts`.
//! fn app(store: MemoryStore, receipts: Arc<AtomicUsize>) -> Router {
//!     let layer = IdempotencyLayer::new(store).key(key::stripe()).verify(verify::stripe(SECRET));
//!     let handler = move || async move {
//!         tokio::time::sleep(std::time::Duration::from_millis(5)).await; // some work
//!         receipts.fetch_add(1, Ordering::SeqCst); // the receipt e-mailed
//!         "sent"
//!     };
//!     Router::new().route("/webhooks/stripe", post(handler).layer(layer))
//! }
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() {
//! let (store, receipts) = (MemoryStore::new(), Arc::new(AtomicUsize::new(0)));
//! let count = receipts.clone();
//! // Two instances of the app, as two processes: one store between them.
//! let sender = Sender::instances(2, move |_| std::future::ready(app(store.clone(), receipts.clone())))
//!     .effects(move || std::future::ready(count.load(Ordering::SeqCst)));
//!
//! let stripe = sign::stripe(SECRET);
//! let paid = |id: &str| stripe.delivery(format!(r#"{{"id":"{id}"}}"#)).to("/webhooks/stripe");
//! sender.assert(Scenario::in_a_row(&paid("evt_1"), 3)).await;
//! sender.assert(Scenario::at_once(&paid("evt_2"), 8)).await;
//! let report = sender.assert(Scenario::hang_up(&paid("evt_3"))).await;
//! assert_eq!(report.effects(), Some(1));
//! }
//! # main() }
//! ```
//!
//! # Signed deliveries
//!
//! [`sign`] makes the [`Delivery`] each sender that [`verify`](crate::verify) knows would
//! send, signed with a secret, at a time a test chooses; and the forgeries a test of the
//! refusals needs: a tampered body, no signature, an old timestamp, another secret.
//!
//! # The scenarios
//!
//! A [`Sender`] plays a [`Scenario`] against one or [several instances](Sender::instances)
//! of the app, and answers a [`Report`], or a [`Failure`] whose message says what went
//! wrong, what was sent and answered, how many effects there were, and the usual cause:
//!
//! ```text
//! 2 effects for 1 event after 8 concurrent copies across 2 instances: the route's store is
//! not shared between instances, or its unique index is missing
//!   scenario: 8 concurrent copies across 2 instances
//!   delivery: Stripe delivery of evt_2 (POST /webhooks/stripe)
//!   deliveries sent: 9
//!   answers: 200 | 200 | 409 in-flight → 200 duplicate | 200 duplicate | …
//!   effects: 2
//! ```
//!
//! [`Sender::assert`] panics with that message; [`Sender::run`] returns it.
//!
//! Every answer must come after its work: once a delivery is answered 2xx, its effect must
//! be visible, or the scenario fails (a handler that answers 200 and does the work in a
//! spawned task loses the event when that work fails). An [inbox](crate::inbox) route answers
//! 202 before its work on purpose: test its handler behind an inline layer instead, which
//! is the service the inbox's workers call.

mod delivery;
mod sender;
pub mod sign;

pub use delivery::Delivery;
pub use sender::{Failure, Report, Scenario, Sender};
