//! Inbox mode: answer the sender as soon as its delivery is stored durably, and run the
//! handler later, exactly once, on workers of any number of instances.
//!
//! The [`IngestLayer`] verifies a delivery and finds its key as the inline layer does, then
//! makes one durable write holding both the claim and the delivery (method, path and query,
//! headers, body) and answers 202. The handler does not run on the request path. A duplicate
//! of any event the inbox holds, queued, running, done or dead, is answered 200 without a
//! write: the delivery is kept, so the sender has nothing left to do.
//!
//! [`Workers`] take due entries under a lease with a fencing token and a heartbeat (the same
//! lease guard as inline mode's claims), rebuild each request from the stored bytes and send
//! it through the service you give them, usually the whole app, so that routing, path
//! parameters and extractors work as they did for the sender. When it reaches the route
//! behind the inbox layer, the layer runs the route's handler in a task of its own and hands
//! its answer straight back to the worker: a handler moves between inline and inbox mode
//! unchanged, and **the handler's own answer settles the entry**, whatever the app around the
//! route does (an app-wide timeout that gives up half way, another layer that answers by
//! itself). A 2xx settles the entry done; another status, an `Err` or a panic queues it again
//! after an exponential [`Backoff`] with jitter; after the last attempt it is dead, kept for
//! a person (the `admin` module, feature `admin`, lists, retries and discards entries). A
//! request the app answers without reaching its route (a 404, a fallback's 200, an auth
//! layer's 401) is a failed attempt that says so, never done.
//!
//! An inbox layer checks signatures (`.verify(..)`) or is told
//! [`unverified`](IngestLayer::unverified); see [why](IngestLayer#verification-is-not-optional).
//!
//! ```
//! # #[cfg(all(feature = "memory", feature = "axum"))] {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::time::Duration;
//!
//! use axum::{Router, routing::post};
//! use http::{Request, StatusCode};
//! use tower::ServiceExt;
//! use tower_idempotency::{inbox::Inbox, key, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let runs = Arc::new(AtomicUsize::new(0));
//! let counted = runs.clone();
//! let inbox = Inbox::new(MemoryStore::new());
//! let app = Router::new().route(
//!     "/webhooks/github",
//!     post(move || async move {
//!         counted.fetch_add(1, Ordering::SeqCst); // the slow work goes here
//!         StatusCode::NO_CONTENT
//!     })
//!     .layer(inbox.layer().key(key::github()).unverified()),
//! );
//! // Workers send the stored deliveries through the same app.
//! let workers = inbox.workers(app.clone()).spawn();
//!
//! let delivery = || {
//!     Request::post("/webhooks/github")
//!         .header("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
//!         .body(axum::body::Body::from("{}"))
//!         .unwrap()
//! };
//! let first = app.clone().oneshot(delivery()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::ACCEPTED);
//! let again = app.clone().oneshot(delivery()).await.unwrap();
//! assert_eq!(again.status(), StatusCode::OK); // a duplicate: stored already
//!
//! while runs.load(Ordering::SeqCst) == 0 {
//!     tokio::time::sleep(Duration::from_millis(5)).await;
//! }
//! workers.stop().await;
//! assert_eq!(runs.load(Ordering::SeqCst), 1);
//! # }
//! # }
//! ```
//!
//! # What is promised
//!
//! - **Acknowledged means stored.** The 2xx goes out only after the store's write returned:
//!   durable on the SQL stores (PostgreSQL, MySQL/MariaDB, SQLite in WAL mode). Forged → 401
//!   and nothing stored; no key → 400; body over the limit → 413; store down or draining →
//!   503 with `Retry-After`, so the sender tries again.
//! - **Each event's handler completes once.** A worker holds its entry under a lease it
//!   renews; a worker that dies stops renewing, and after the stale limit the entry is taken
//!   over (reclaim) or left for a person (hold), as [`Stale`](crate::Stale) says. Crashes are
//!   counted apart from failures and use up attempts too: an event that kills its worker every
//!   time ends dead, not in a loop. A handler whose effect must not happen twice even across
//!   such a crash keeps the effect and the settlement together, as in inline mode.
//! - **No head-of-line blocking.** Entries run concurrently, up to
//!   [`Workers::concurrency`]; a slow or failing one holds only its own slot. Order across
//!   events is not kept; per-entity order is the [version guard](crate::version_guard)'s
//!   job, and a version-guarded handler works unchanged behind the inbox.
//! - **Idle workers start at once.** An ingest wakes the workers of its own process at once;
//!   PostgreSQL's `LISTEN/NOTIFY` wakes those of other instances. Otherwise a worker polls
//!   every [`Workers::poll_interval`].
//! - **Retention.** A done entry's stored request (personal data, often) is deleted after
//!   [`Workers::keep_requests_for`]; the entry itself, which answers duplicates, after
//!   [`Workers::keep_entries_for`]. Dead entries keep their request until a person acts.
//!
//! # What is kept of a request
//!
//! The method, the path and query, the body, and the headers but the hop-by-hop ones
//! (`Connection`, `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`)
//! and the credentials (`Authorization`, `Cookie`); see [`IngestLayer::keep_header`] and
//! [`IngestLayer::drop_header`]. Request extensions (a `ConnectInfo`, say) are not kept.
//!
//! The path kept is the one the app received: with axum, before a `Router::nest` (or
//! `nest_service`) took its prefix off, so that the worker's request, sent through the whole
//! app, finds the nested route again.
//!
//! A worker's request goes through everything the app puts in front of the route, as a
//! sender's does. The guards of this crate in front of it (an app-wide
//! [`IdempotencyLayer`](crate::IdempotencyLayer), say) let it through: the inbox already
//! decided who runs the event. A middleware that checks credentials sees the stored request,
//! without its `Authorization`: webhook routes are authenticated by their signature
//! (`verify`, which the inbox layer runs before it stores, and skips for a worker's request);
//! keep the header the middleware needs ([`IngestLayer::keep_header`]), or let requests that
//! carry an [`InboxDelivery`] in their extensions through (nothing a client sends can put one
//! there).
//!
//! # What the handler is told
//!
//! The request carries an [`InboxDelivery`]: the event's key, the attempt, the crashes before
//! it, and when the event was received. A handler that checks the sender's timestamp itself
//! fails attempts made long after the delivery arrived; see [`InboxDelivery`].

use std::fmt;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::store::inbox::InboxStore;

mod attempt;
mod backoff;
mod delivery;
mod layer;
mod mode;
mod settle;
mod worker;

pub use backoff::Backoff;
pub use delivery::InboxDelivery;
pub use layer::{Ingest, IngestLayer};
pub use mode::IngestMode;
pub use worker::{WorkerHandle, Workers};

/// An inbox on a store: makes the [`IngestLayer`]s that fill it and the [`Workers`] that empty
/// it, which share its store and its wake-ups. Cheap to clone.
pub struct Inbox<St> {
    shared: Arc<Shared<St>>,
}

struct Shared<St> {
    store: St,
    /// Wakes this process's idle workers when an ingest stored an entry.
    wake: Arc<Notify>,
}

impl<St> Clone for Inbox<St> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for Inbox<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("store", &self.shared.store)
            .finish()
    }
}

impl<St: InboxStore + Clone> Inbox<St> {
    /// An inbox in `store`: the SQL stores keep it in a table of its own beside the claims
    /// (made by their `migrate()`), the memory store in memory.
    pub fn new(store: St) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                wake: Arc::new(Notify::new()),
            }),
        }
    }

    /// A layer that stores each delivery of its route in this inbox, finding keys with
    /// [`key::auto`](crate::key::auto) until [`key`](IngestLayer::key) says otherwise.
    pub fn layer(&self) -> IngestLayer<St> {
        IngestLayer::new(self.clone())
    }

    /// Workers that run this inbox's entries through `service`: the app whose routes carry
    /// the inbox layers, as a router would be served. Nothing runs until
    /// [`spawn`](Workers::spawn).
    pub fn workers<S>(&self, service: S) -> Workers<St, S> {
        Workers::new(self.clone(), service)
    }
}

impl<St> Inbox<St> {
    /// The store.
    pub fn store(&self) -> &St {
        &self.shared.store
    }

    pub(crate) fn wake(&self) -> &Arc<Notify> {
        &self.shared.wake
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests;
