use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::mode::{ClaimMode, ClaimSettings};
use crate::engine::mode::{Guarded, HeldHook, Settings, shared_settings};
use crate::journal::Journal;
use crate::key::{self, Auto, ExtractKey, IdempotencyKey};
use crate::replay::{Replay, RequestFingerprint};
use crate::store::{Pending, Stale, Store};

/// The service made by [`IdempotencyLayer`]: claim, run the inner service, then commit or
/// release. See [`Guarded`], the service shell every mode shares.
pub type Idempotency<S, St, K = Auto> = Guarded<S, ClaimMode<St, K>>;

/// Makes an inner service process each event once: claim the key, run the inner service,
/// commit on success, release on failure.
///
/// Built with [`IdempotencyLayer::new`] and configured with its builder methods; see the
/// [crate documentation](crate) for what each delivery gets.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{IdempotencyLayer, Stale, key, store::MemoryStore};
///
/// // Charges move money: a claim whose owner died waits for a person instead of running twice.
/// let layer = IdempotencyLayer::new(MemoryStore::new())
///     .key(key::stripe())
///     .stale(Stale::hold_after(Duration::from_secs(30)))
///     .body_limit(256 * 1024);
/// # let _ = layer;
/// ```
#[must_use]
#[derive(Debug, Clone)]
pub struct IdempotencyLayer<St, K = Auto> {
    store: St,
    key: K,
    settings: Settings,
    claims: ClaimSettings,
}

impl<St> IdempotencyLayer<St> {
    /// A layer that keeps claims in `store` and finds keys with [`key::auto`], which
    /// recognises the common webhook senders by their headers.
    ///
    /// Defaults: commit on 2xx; a claim not renewed for 30 seconds is stale and reclaimed (the
    /// layer renews running claims every 7.5 seconds); bodies buffered (only for body keys) up
    /// to 1 MiB within 30 seconds; store calls bounded by 5 seconds; `Retry-After: 5` on the
    /// in-flight 409 and on 503; a request without a key rejected with 400; a duplicate in
    /// flight answered at once; keys scoped by the route the router
    /// matched ([`Scope::route`](crate::key::Scope::route)); no signature verification.
    ///
    /// The layer uses tokio's timers and spawns tasks (for handlers whose delivery went away):
    /// run it on a tokio runtime with time enabled (the default of `#[tokio::main]`).
    pub fn new(store: St) -> Self {
        Self {
            store,
            key: key::auto(),
            settings: Settings::default(),
            claims: ClaimSettings::default(),
        }
    }
}

/// The 4xx that [`IdempotencyLayer::for_api`] releases: the client may send the same request
/// again (408, 409, 423, 425, 429), or fix it with credentials or headers (401, 403, 415).
const RETRIED: [u16; 8] = [401, 403, 408, 409, 415, 423, 425, 429];

impl<St> IdempotencyLayer<St, key::Header> {
    /// A layer for API idempotency keys, after the IETF `Idempotency-Key` draft: the key in
    /// the client's `Idempotency-Key` header ([`key::idempotency_key`], an RFC 8941 String,
    /// bare text accepted), answers replayed ([`Replay::new`]) and requests fingerprinted
    /// ([`RequestFingerprint::new`]: method, path and query, body).
    ///
    /// It commits, stores and replays every answer except those that ask the client to try
    /// the same request again: 5xx, 429, 408, 409, 423 and 425, and 401, 403 and 415, which a
    /// client fixes with other credentials or headers the fingerprint leaves out. Those
    /// release the claim, so the retry runs. Any other 4xx is the request's answer and is
    /// replayed (a declined card stays declined); [`commit_when`](Self::commit_when) changes
    /// the rule.
    ///
    /// Put it on the routes that take keys (`MethodRouter::layer`, `Router::route_layer`):
    /// every request it sees needs one, a `GET` included.
    ///
    /// As the draft asks: a request without a key is answered 400, one whose key is still in
    /// flight 409, one that reuses a key for another request 422. Stored answers are kept
    /// as long as their keys, until [`purge_completed`](crate::store::Store::purge_completed)
    /// deletes them after the application's retention. See the [`replay`](crate::replay)
    /// module for what is stored and what is not, and how to scope keys per client.
    pub fn for_api(store: St) -> Self {
        IdempotencyLayer::new(store)
            .key(key::idempotency_key())
            .replay(Replay::new())
            .fingerprint(RequestFingerprint::new())
            .commit_when(|status| !status.is_server_error() && !RETRIED.contains(&status.as_u16()))
    }
}

impl<St, K> IdempotencyLayer<St, K> {
    /// Stores the answer of each committed delivery (status, allowlisted headers, a body of
    /// known length up to the limit) and answers the key's duplicates with it, marked
    /// `Idempotent-Replayed: true`, instead of the plain 200. 5xx and 429 answers are never
    /// stored. See the [`replay`](crate::replay) module.
    pub fn replay(mut self, replay: Replay) -> Self {
        self.claims.replay = Some(Arc::new(replay));
        self
    }

    /// Fingerprints each request (method, path, body, chosen headers) and answers 422 to a
    /// request whose key was committed with another fingerprint: the key reused for another
    /// request. A fingerprint that reads the body buffers it, within the
    /// [`body_limit`](Self::body_limit).
    pub fn fingerprint(mut self, fingerprint: RequestFingerprint) -> Self {
        self.claims.fingerprint = Some(Arc::new(fingerprint));
        self
    }

    /// Notes each delivery's outcome, time and the sender's attempt number in `journal`, for
    /// an operator to read ([`Journal::last`], [`Journal::recent`]). Writes
    /// nothing to the store.
    pub fn journal(mut self, journal: &Journal) -> Self {
        self.claims.journal = Some(journal.clone());
        self
    }

    /// Records each run of the handler (which delivery ran, the instance, start, end and
    /// status, or how it ended without one: recorded before its commit or release, also when
    /// the sender hung up or it panicked) and each delivery answered without a run (duplicate,
    /// in flight, held, refused) in a ledger, through `recorder`: a delivery that ran is
    /// recorded by its run. The records are appended off the delivery's path: see
    /// [`Recorder`](crate::ledger::Recorder) for what a crash can lose.
    #[cfg(feature = "ledger")]
    #[cfg_attr(docsrs, doc(cfg(feature = "ledger")))]
    pub fn ledger(mut self, recorder: &crate::ledger::Recorder) -> Self {
        self.claims.ledger = Some(recorder.clone());
        self
    }

    /// Finds keys with `key` instead, e.g. [`key::stripe()`] or
    /// [`key::header("x-event-id")`](key::header).
    pub fn key<K2: ExtractKey>(self, key: K2) -> IdempotencyLayer<St, K2> {
        IdempotencyLayer {
            store: self.store,
            key,
            settings: self.settings,
            claims: self.claims,
        }
    }

    /// Decides what happens to stale claims, whose owner stopped renewing them:
    /// [`Stale::reclaim_after`] (the default, after 30 seconds) or [`Stale::hold_after`].
    pub fn stale(mut self, stale: Stale) -> Self {
        self.claims.stale = stale;
        self
    }

    /// Called when a delivery meets a stale claim that the hold policy keeps: the place to
    /// page a person. A warning is logged either way.
    pub fn on_held<F>(mut self, hook: F) -> Self
    where
        F: Fn(&IdempotencyKey, &Pending) + Send + Sync + 'static,
    {
        self.claims.on_held = Some(HeldHook(Arc::new(hook)));
        self
    }

    /// Lets a duplicate that arrives while the first delivery runs wait up to `wait` for it
    /// to settle, then answer as a duplicate (200) if it committed, or run the handler if it
    /// released. Past `wait`, the duplicate gets the 409 it gets at once by default.
    ///
    /// A first delivery in the same process wakes its waiters when it settles; one in another
    /// process is polled with [`Store::describe`](crate::store::Store::describe), which
    /// writes nothing. Keep `wait` below the sender's request timeout, or the sender hangs up
    /// on the wait. A waiter that ends up claiming is counted as a delivery twice.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::{Request, Response, StatusCode};
    /// use tower::{ServiceBuilder, ServiceExt, service_fn};
    /// use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let svc = ServiceBuilder::new()
    ///     .layer(IdempotencyLayer::new(MemoryStore::new())
    ///         .key(key::github())
    ///         .wait_in_flight(Duration::from_secs(2)))
    ///     .service(service_fn(|_req| async {
    ///         tokio::time::sleep(Duration::from_millis(100)).await;
    ///         Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    ///     }));
    /// let delivery = || Request::post("/").header("x-github-delivery", "d-1").body(String::new()).unwrap();
    /// let first = tokio::spawn(svc.clone().oneshot(delivery()));
    /// tokio::task::yield_now().await;
    /// // Arrives while the first runs; answered once the first committed, not with 409.
    /// let second = svc.oneshot(delivery()).await.unwrap();
    /// assert_eq!(second.status(), StatusCode::OK);
    /// assert_eq!(second.headers()["idempotency-outcome"], "duplicate");
    /// assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    /// # }
    /// ```
    pub fn wait_in_flight(mut self, wait: Duration) -> Self {
        self.claims.wait_in_flight = Some(wait);
        self
    }

    shared_settings!(journal: claims);

    /// The store this layer uses.
    pub fn store(&self) -> &St {
        &self.store
    }
}

impl<S, St, K> Layer<S> for IdempotencyLayer<St, K>
where
    St: Store + Clone,
    K: ExtractKey + Clone,
{
    type Service = Idempotency<S, St, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Guarded::new(
            inner,
            Arc::new(ClaimMode::new(
                self.store.clone(),
                self.key.clone(),
                self.settings.clone(),
                self.claims.clone(),
            )),
        )
    }
}
