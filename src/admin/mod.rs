//! An axum router for operators: the claims that are held or stuck, one key's record, the two
//! maintenance steps a person takes by hand (resolve a claim, purge settled keys), and, with
//! [`Admin::inbox`], the inbox's entries (list, show the stored request, retry, discard).
//!
//! [`Admin::new(store)`](Admin::new)[`.router()`](Admin::router) answers an HTML page at `/`
//! and the JSON routes it uses. Mount it under a prefix of your application, **behind your
//! application's authentication**:
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, body::Body, extract::Request, middleware::{self, Next}, response::Response};
//! use http::StatusCode;
//! use tower::ServiceExt;
//! use tower_idempotency::{IdempotencyKey, Stale, admin::Admin};
//! use tower_idempotency::store::{Claim, MemoryStore, Store};
//!
//! /// The application's own check; a session cookie or a proxy's single sign-on does as well.
//! async fn require_token(req: Request, next: Next) -> Result<Response, StatusCode> {
//!     match req.headers().get("authorization") {
//!         Some(value) if value == "Bearer s3cret" => Ok(next.run(req).await),
//!         _ => Err(StatusCode::UNAUTHORIZED),
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = MemoryStore::new();
//! // The layer's stale policy; the router is told the same.
//! let stale = Stale::hold_after(Duration::ZERO);
//! let app = Router::new()
//!     .nest("/admin", Admin::new(store.clone()).stale(stale).router())
//!     .layer(middleware::from_fn(require_token));
//!
//! // A claim whose owner died: nobody renews it.
//! let key = IdempotencyKey::new("github@/webhooks/github", "d-1").unwrap();
//! let Ok(Claim::Acquired(_lease)) = store.claim(&key, stale).await else { panic!("claimed") };
//!
//! let get = |uri: &str, token: Option<&str>| {
//!     let mut req = http::Request::get(uri);
//!     if let Some(token) = token {
//!         req = req.header("authorization", token);
//!     }
//!     req.body(Body::empty()).unwrap()
//! };
//! let refused = app.clone().oneshot(get("/admin/claims?older_than_s=0", None)).await.unwrap();
//! assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
//!
//! let listed = app.clone().oneshot(get("/admin/claims?older_than_s=0", Some("Bearer s3cret"))).await.unwrap();
//! assert_eq!(listed.status(), StatusCode::OK);
//! let body = axum::body::to_bytes(listed.into_body(), 1 << 20).await.unwrap();
//! let claims: serde_json::Value = serde_json::from_slice(&body).unwrap();
//! assert_eq!(claims[0]["namespace"], "github@/webhooks/github");
//! assert_eq!(claims[0]["key"], "d-1");
//! assert_eq!(claims[0]["state"], "held");
//!
//! // Mark it done by hand: the sender's next retry is answered as a duplicate.
//! let resolve = http::Request::post("/admin/keys/resolve")
//!     .header("authorization", "Bearer s3cret")
//!     .header("content-type", "application/json")
//!     .body(Body::from(r#"{"namespace":"github@/webhooks/github","key":"d-1","resolution":"done"}"#))
//!     .unwrap();
//! let resolved = app.oneshot(resolve).await.unwrap();
//! assert_eq!(resolved.status(), StatusCode::OK);
//! assert!(matches!(store.claim(&key, Stale::default()).await, Ok(Claim::Done(_))));
//! # }
//! ```
//!
//! Tell the router the layer's stale limit and policy with [`Admin::stale`] (the same
//! [`Stale`] as the layer's): it then tells a claim whose owner still renews it
//! (*running*) from one whose owner stopped (*stale*, or *held* under the hold policy), and
//! refuses to resolve a running claim unless asked to force it.
//!
//! The page calls the routes by URLs made from its own path and `location.origin`, so it works
//! under any prefix, served at `/admin` as at `/admin/`, and opened as
//! `https://user:pass@host/admin/` too (a browser refuses `fetch` of a URL with credentials in
//! it, which a relative URL under such a page is). Which of `/admin` and `/admin/` answers is
//! the application's router's choice: axum 0.8's [`Router::nest`] answers `/admin` only;
//! [`Router::nest_service`] hands both to this router.
//!
//! # Never without authentication
//!
//! The router checks nobody's identity: whoever reaches it can mark events done that never
//! ran, release claims whose work did run, and purge keys. **Never expose it without an
//! authentication layer in front of it**: `.layer(..)` on the router it is nested in, as
//! above, or [`route_layer`](axum::Router::route_layer) on a router of its own, or a
//! reverse proxy that lets only operators through. The page calls the routes from the
//! browser with `fetch`, which sends cookies, HTTP Basic credentials and client certificates
//! by itself but no header of its own: use an authentication the browser carries.
//!
//! # Routes
//!
//! Relative to where the router is mounted. Durations are seconds, as JSON numbers with a
//! fraction (`older_than_s=0.5`); ages are measured by the store's clock.
//!
//! | route | answer |
//! |---|---|
//! | `GET /` | the page: held, stale and (with a short time) running claims, how many, why each is listed, ages that keep moving, buttons to resolve them (for running claims only with the force box ticked), a form to look up one key; with [`Admin::inbox`], the inbox's queued, retrying, running and dead entries, with buttons to retry or discard them, retry a namespace's dead, and show an entry's stored request |
//! | `GET /claims?older_than_s=N&limit=L` | `processing` claims not renewed for `N` seconds (default [`stuck_after`](Admin::stuck_after)), longest silent first, the first `L` of them (100 unless said, 1 to 1000): `[{namespace, key, age_s, since_renewal_s, deliveries, runs, renewed_ago_s, state, why, stale_in_s}]`; the `x-total-count` header counts them all |
//! | `GET /keys?namespace=NS&key=K` | one key's record: `{namespace, key, state, deliveries, runs, reclaimed, first_seen_ago_s, last_seen_ago_s, claimed_ago_s, renewed_ago_s, settled_ago_s, receipt}`, 404 if the store does not know it |
//! | `POST /keys/resolve` `{namespace, key, resolution: "done" \| "release", force?}` | `{resolved}`: whether there was a `processing` claim to settle; 409 for a running claim unless `force` is `true` |
//! | `POST /purge` `{older_than_s?}` | `{purged}`: `done` and `released` keys settled that long ago (default [`retention`](Admin::retention)) deleted |
//!
//! On the SQL stores `GET /claims` (and so the page) reads the whole claims table: no index
//! holds the claims in flight, which would cost every commit. PostgreSQL's and SQLite's
//! store docs show the index to add where the list is read often on a large table.
//!
//! With [`Admin::inbox`], the routes of the [inbox](#the-inbox) too:
//!
//! | route | answer |
//! |---|---|
//! | `GET /inbox?state=S1,S2&namespace=NS&limit=L` | `{stats: {queued, running, dead, oldest_due_s}, entries: [..]}`: the counts (of `NS` when given) and the oldest entries in the states listed (`queued`, `running`, `done`, `dead`; all but `done` unless said), of `NS` when given, the first `L` (100 unless said, 1 to 1000); each entry `{namespace, key, state, attempts, crashes, age_s, due_in_s, since_renewal_s, stuck, has_request, last, history}` |
//! | `GET /inbox/entry?namespace=NS&key=K` | the entry as listed, and its stored `request`: `{method, uri, headers, body, body_encoding, body_bytes, truncated}`, or `null` once retention deleted it; 404 if the inbox has no such entry |
//! | `POST /inbox/retry` `{namespace, key, force?}` | `{retried: true}`: the entry is due now, a dead one with its attempts counted from zero, a running one (held after its worker stopped renewing) taken from that worker; 409 for a running entry renewed within the stale limit unless `force`; 404 if the key has no such entry |
//! | `POST /inbox/retry-dead` `{namespace}` | `{retried}`: how many dead entries of the namespace were made due now |
//! | `POST /inbox/discard` `{namespace, key, force?}` | `{discarded: true}`: the entry is done without running (a running one as for retry: held, or with `force`); 404 if the key has no entry or a done one |
//!
//! `namespace` is the namespace as stored, with the [scope](crate::Scope) joined to it
//! (`github@/webhooks/github`), as `/claims` lists it. `runs` and `renewed_ago_s` in the list
//! come from the key's record and are `null` for a claim settled between the two reads.
//! `receipt` is `null`, or `{fingerprint, status}` for a key committed with a
//! [receipt](crate::store::Receipt): the fingerprint in hex and the stored response's status,
//! each `null` when not kept.
//!
//! `state` in the list says why a claim is listed, judged by the [stale limit](Admin::stale)
//! against its latest heartbeat (`renewed_ago_s`, or `since_renewal_s` when that is `null`):
//! `running` when its owner renewed it within the limit (its handler runs: listed only because
//! `older_than_s` is below the limit), `stale` when the owner stopped renewing it and the
//! reclaim policy takes it over at the next delivery, `held` when the owner stopped and the
//! hold policy leaves it for a person. `why` says the same in a sentence; `stale_in_s` is how
//! long a running claim has left before it turns stale unless renewed again (`null` for the
//! others).
//!
//! Errors are `application/problem+json` (RFC 9457: `title`, `status`, `detail`): 400 for a
//! body that is no JSON or a query that does not parse, 422 for JSON of the wrong shape, 404
//! for an unknown key, entry or route (the inbox's routes too, without [`Admin::inbox`]), 405 for a wrong method, 409 for resolving a running claim
//! without `force`, 413 for a body over 64 KiB, 415 and 403 as below, and 503 when the store
//! fails (the error is logged at `ERROR`).
//!
//! Resolving by hand is a decision about work nobody can see any more: `done` when the side
//! effect happened (further deliveries are duplicates), `release` when it did not (the next
//! delivery runs the handler). A purge with a short `older_than_s` forgets keys the senders may
//! still retry: their retries then run again.
//!
//! A *running* claim is different: its handler is still at work. Releasing it lets the next
//! delivery run beside it; marking it done answers duplicates for work that may yet fail. So
//! `POST /keys/resolve` reads the claim first and answers 409 (saying how long ago it was
//! renewed) when its owner renewed it within the stale limit, unless the body says
//! `"force": true`. The read and the resolve are two steps: an owner that renews in between
//! (one paused past the limit, then back) is resolved all the same. Its lease is fenced, so
//! its later renewal or commit then fails as a lost lease and changes nothing; that is also
//! what `force` accepts for a claim known to be running.
//!
//! # The inbox
//!
//! An [inbox](crate::inbox) entry is one acknowledged delivery waiting for, or done by, the
//! workers. `state` is where it is: `queued` (new, or waiting `due_in_s` for its next attempt
//! after a failed one: the page calls a queued entry with attempts *retrying*), `running` (a
//! worker holds it; `since_renewal_s` since its last heartbeat), `done`, or `dead` (its
//! attempts ran out: it waits for a person). `attempts` counts the attempts started, crashes
//! included, and `crashes` those whose worker stopped renewing its lease. `stuck` is `true`
//! for a running entry whose worker has not renewed it for the [stale limit](Admin::stale) or
//! longer: under the reclaim policy the workers' next take runs it again; under the hold
//! policy it stays as it is, and no route here changes it. `age_s` is the time since the
//! first copy was stored.
//!
//! `history` lists the recorded attempts, oldest first (the latest
//! [`HISTORY_LIMIT`](crate::store::inbox::HISTORY_LIMIT)), and `last` repeats the latest or is
//! `null`: each `{at_ms, duration_ms}`, the start in milliseconds since the Unix epoch by the
//! worker's clock, with `status` (the service answered with it), `error` (it failed or
//! panicked, and how) or `crashed: true`.
//!
//! The stored request of `GET /inbox/entry` is the one the workers run: `headers` is a list of
//! `[name, value]` pairs in their order, each value read as UTF-8 with anything else replaced;
//! `body` is the first 64 KiB of the body, as text when `body_encoding` is `"utf-8"` and as
//! standard base64 when it is `"base64"` (bytes that are no UTF-8); `body_bytes` is the length
//! of the whole body and `truncated` whether it is longer than what is shown.
//!
//! Retrying makes an entry due now: the workers run it at their next look at the inbox (at
//! the latest their [poll interval](crate::inbox::Workers::poll_interval)). Retrying a dead
//! entry gives it its attempts again, from zero; its history stays. Discarding marks an entry
//! done without running its handler, for an event whose work is done another way or must
//! never happen: its deliveries are then answered as duplicates. Neither acts on a running
//! entry, whose worker still holds it.
//!
//! # Cross-site requests are refused
//!
//! A browser of an operator who is logged in sends their credentials with every request to
//! the router, also one that another site makes it send (cross-site request forgery). So the
//! routes that change something are `POST` only, and every request that is not a `GET` or
//! `HEAD`:
//!
//! - must be `Content-Type: application/json`, or it is refused with 415. An HTML form on
//!   another site can only send `application/x-www-form-urlencoded`, `multipart/form-data` or
//!   `text/plain`; a page that asks `fetch` for `application/json` makes the browser send a
//!   CORS preflight first, which this router never answers with the permissions it asks for,
//!   so the browser never sends the request itself.
//! - is refused with 403 when the browser says it comes from another site: `Sec-Fetch-Site`
//!   `cross-site` or `same-site` (a sibling subdomain is another origin). The page's own
//!   requests say `same-origin`; clients that are not browsers send no such header.
//!
//! The page forbids being framed by another site (`Content-Security-Policy: frame-ancestors
//! 'none'`, `X-Frame-Options: DENY`), so it cannot be overlaid to trick a click, and it loads
//! nothing from elsewhere: its policy allows its own inline script and style, by hash, and
//! requests to its own origin.

mod guard;
mod inbox;
mod page;
mod problem;
mod routes;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

use crate::journal::Journal;
use crate::store::inbox::InboxStore;
use crate::store::{DEFAULT_RETENTION, Stale, Store};

/// The default of [`Admin::stuck_after`]: a claim not renewed for a minute is listed.
pub const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(60);

/// The operators' router over a [`Store`]; see the [module documentation](self).
#[must_use]
pub struct Admin<St> {
    store: St,
    retention: Duration,
    stuck_after: Duration,
    stale: Stale,
    journal: Option<Journal>,
    /// Adds the inbox's routes: set by [`Admin::inbox`], where the store is known to hold an
    /// inbox, so that [`Admin::router`] needs no more than a [`Store`].
    inbox: Option<fn(Routes<St>) -> Routes<St>>,
}

/// The router of an [`Admin`] before its state is given.
type Routes<St> = Router<Arc<Admin<St>>>;

impl<St: Store + Clone> Admin<St> {
    /// The router's settings for `store`: the retention of [`DEFAULT_RETENTION`] for
    /// `POST /purge`, claims not renewed for [`DEFAULT_STUCK_AFTER`] listed as stuck, the
    /// default [`Stale`] (reclaim after 30 seconds) to tell running claims from stale ones.
    pub fn new(store: St) -> Self {
        Self {
            store,
            retention: DEFAULT_RETENTION,
            stuck_after: DEFAULT_STUCK_AFTER,
            stale: Stale::default(),
            journal: None,
            inbox: None,
        }
    }

    /// The stale limit and policy of the layer in front of the store: use the same [`Stale`]
    /// as the layer ([`IdempotencyLayer::stale`](crate::IdempotencyLayer::stale)).
    ///
    /// A claim renewed within its limit is *running*: `GET /claims` says so, and
    /// `POST /keys/resolve` refuses it with 409 unless the body says `"force": true`. Past the
    /// limit it is *held* under [`Stale::hold_after`] and *stale* (reclaimed by the next
    /// delivery) under [`Stale::reclaim_after`]. When layers with different limits share the
    /// store, give the longest: a shorter one would call their running claims stale.
    pub fn stale(mut self, stale: Stale) -> Self {
        self.stale = stale;
        self
    }

    /// Reads the layer's [`Journal`] too: `GET /keys` then also answers the key's latest
    /// outcome in this process, when, and the sender's attempt number (`last`). Give it the
    /// journal the layer writes ([`IdempotencyLayer::journal`](crate::IdempotencyLayer::journal)).
    pub fn journal(mut self, journal: &Journal) -> Self {
        self.journal = Some(journal.clone());
        self
    }

    /// How long ago a key must have been settled for `POST /purge` without `older_than_s` to
    /// delete it. Keep it longer than any sender retries.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long a claim must have gone without a heartbeat for `GET /claims` without
    /// `older_than_s` (and the page) to list it. The layer renews a running claim every
    /// quarter of its stale limit, so a limit above the stale limit lists only claims whose
    /// owner stopped: held claims, and claims waiting to be reclaimed.
    pub fn stuck_after(mut self, stuck_after: Duration) -> Self {
        self.stuck_after = stuck_after;
        self
    }

    /// The router, to mount with [`Router::nest`] (or [`Router::merge`]) behind the
    /// application's authentication.
    pub fn router(&self) -> Router {
        let state = Arc::new(Self {
            store: self.store.clone(),
            retention: self.retention,
            stuck_after: self.stuck_after,
            stale: self.stale,
            journal: self.journal.clone(),
            inbox: self.inbox,
        });
        let mut router = Router::new()
            .route("/", get(page::page))
            .route("/claims", get(routes::claims::<St>))
            .route("/keys", get(routes::describe::<St>))
            .route("/keys/resolve", post(routes::resolve::<St>))
            .route("/purge", post(routes::purge::<St>));
        if let Some(add_inbox) = self.inbox {
            router = add_inbox(router);
        }
        // After every route: the fallback for a wrong method applies to the routes added so far.
        router
            .fallback(problem::not_found)
            .method_not_allowed_fallback(problem::method_not_allowed)
            .layer(axum::middleware::from_fn(guard::refuse_cross_site))
            .with_state(state)
    }
}

impl<St: Store + InboxStore + Clone> Admin<St> {
    /// Adds the routes of the store's [inbox](crate::inbox) to the router, and its section to
    /// the page: the entries queued, retrying, running and dead, their attempts, their stored
    /// requests, and the buttons to retry or discard them (see the [routes](self#the-inbox)).
    ///
    /// The inbox's workers keep the stale limit of [`Workers::stale`](crate::inbox::Workers::stale);
    /// give [`Admin::stale`] the same, so that the router tells a running entry whose worker
    /// stopped renewing it (`stuck`).
    ///
    /// ```
    /// use axum::{Router, body::Body};
    /// use http::StatusCode;
    /// use tower::ServiceExt;
    /// use tower_idempotency::IdempotencyKey;
    /// use tower_idempotency::admin::Admin;
    /// use tower_idempotency::store::MemoryStore;
    /// use tower_idempotency::store::inbox::{InboxStore, StoredRequest};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let store = MemoryStore::new();
    /// let app = Router::new().nest("/admin", Admin::new(store.clone()).inbox().router());
    ///
    /// // A delivery waiting for a worker, as an inbox layer stores it.
    /// let key = IdempotencyKey::new("github@/webhooks/github", "d-1").unwrap();
    /// let request = StoredRequest::new(http::Method::POST, "/webhooks/github", vec![], "{}".into());
    /// store.enqueue(&key, &request).await.unwrap();
    ///
    /// let listed = app
    ///     .oneshot(http::Request::get("/admin/inbox").body(Body::empty()).unwrap())
    ///     .await
    ///     .unwrap();
    /// assert_eq!(listed.status(), StatusCode::OK);
    /// let body = axum::body::to_bytes(listed.into_body(), 1 << 20).await.unwrap();
    /// let inbox: serde_json::Value = serde_json::from_slice(&body).unwrap();
    /// assert_eq!(inbox["stats"]["queued"], 1);
    /// assert_eq!(inbox["entries"][0]["key"], "d-1");
    /// assert_eq!(inbox["entries"][0]["state"], "queued");
    /// assert_eq!(inbox["entries"][0]["attempts"], 0);
    /// # }
    /// ```
    pub fn inbox(mut self) -> Self {
        self.inbox = Some(inbox::routes::<St>);
        self
    }
}

impl<St> fmt::Debug for Admin<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("retention", &self.retention)
            .field("stuck_after", &self.stuck_after)
            .field("stale", &self.stale)
            .field("inbox", &self.inbox.is_some())
            .finish_non_exhaustive()
    }
}
