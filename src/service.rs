use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::body::{RequestBody, ResponseBody};
use crate::engine::acquire::acquire;
use crate::engine::drain::Entry;
use crate::engine::guard::{LeaseGuard, Owner, Settle};
use crate::engine::observe::observed;
use crate::engine::prepare::{BoxError, Keyed, key_of, pass_through, record, reject};
use crate::engine::run::{Detach, run};
use crate::engine::settings::{HeldHook, Settings};
use crate::engine::wait;
use crate::future::ResponseFuture;
use crate::journal::{Journal, attempt_of};
use crate::key::{Auto, ExtractKey, IdempotencyKey};
use crate::replay::{Capture, Keeper, Replay, RequestFingerprint};
use crate::response::{self, Outcome};
use crate::store::{
    Claim, Completed, Fingerprint, Lease, Pending, Receipt, Stale, Store, StoreError,
};

/// The service made by [`IdempotencyLayer`](crate::IdempotencyLayer): claim, run the inner
/// service, then commit or release.
///
/// The inner service receives `Request<RequestBody<B>>` and its error type is kept: the
/// layer's own outcomes (duplicate, in flight, bad key, store down) are responses.
///
/// Once a delivery holds its claim, the inner service's future runs to its end whether or not
/// anybody still waits for the answer: if the response future is dropped (hyper drops it when
/// the client disconnects), the inner future moves into a task of its own, and its answer still
/// commits or releases the claim.
///
/// So a timeout layer outside this one bounds how long the sender waits, not how long the
/// claimed work runs: bound that inside the handler. The claim is renewed from a task of its
/// own while the handler waits; a handler that blocks its thread instead stops the runtime's
/// timers, the heartbeat's among them.
///
/// `poll_ready` is always ready: the inner service is driven to readiness inside the response
/// future, once the delivery holds a claim, so that a slow upload or a duplicate answered by
/// the layer never occupies a slot of a concurrency limit further in.
pub struct Idempotency<S, St, K = Auto> {
    inner: S,
    shared: Arc<Shared<St, K>>,
}

pub(crate) struct Shared<St, K> {
    pub(crate) store: St,
    pub(crate) key: K,
    pub(crate) settings: Settings,
    pub(crate) claims: ClaimSettings,
    /// What replay stores, and how: made once from the settings, for every delivery.
    pub(crate) capture: Option<Arc<Capture>>,
}

impl<St, K> Shared<St, K> {
    pub(crate) fn new(store: St, key: K, settings: Settings, claims: ClaimSettings) -> Self {
        let capture = claims.replay.as_ref().map(|replay| {
            Arc::new(Capture {
                replay: replay.clone(),
                fingerprint: claims.fingerprint.clone(),
                timeout: settings.body_timeout,
            })
        });
        Self {
            store,
            key,
            settings,
            claims,
            capture,
        }
    }
}

impl<S, St, K> Idempotency<S, St, K> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<St, K>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, St, K> Clone for Idempotency<S, St, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, K: fmt::Debug> fmt::Debug for Idempotency<S, St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("store", &self.shared.store)
            .field("key", &self.shared.key)
            .field("settings", &self.shared.settings)
            .field("claims", &self.shared.claims)
            .finish()
    }
}

impl<S, St, K, ReqB, ResB> Service<Request<ReqB>> for Idempotency<S, St, K>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    K: ExtractKey,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let inner = self.inner.clone();
        let (parts, body) = req.into_parts();
        observed(Box::pin(deliver(self.shared.clone(), inner, parts, body)))
    }
}

/// One delivery, from key to commit or release.
///
/// The head of the request stays where it came in until the request goes on to the inner
/// service: a future that moved it along would hold it twice. So too this is a function
/// answering an `async move` block, not an `async fn`, which keeps its arguments twice (as
/// passed, and moved into its body). A request is some 260 bytes; the smaller the future, the
/// cheaper its box (an allocator serves small blocks from a cache of its thread).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn holds its arguments twice"
)]
fn deliver<S, St, K, ReqB, ResB>(
    shared: Arc<Shared<St, K>>,
    inner: S,
    parts: Parts,
    body: ReqB,
) -> impl Future<Output = Result<Response<ResponseBody<ResB>>, S::Error>>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    K: ExtractKey,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    async move {
        let fingerprints = shared.claims.fingerprint.as_deref();
        let whole = fingerprints.is_some_and(RequestFingerprint::reads_body);
        let (key, body) = match key_of(&shared.key, &shared.settings, whole, &parts, body).await {
            Keyed::Key(key, body) => (key, body),
            Keyed::PassThrough(body) => {
                // Boxed: the handler's future is no part of the guarded deliveries' futures.
                let unguarded = pass_through(inner, Request::from_parts(parts, body));
                return Box::pin(unguarded).await;
            }
            Keyed::Rejected(error) => return Ok(reject(&error)),
        };
        // Boxed: a fingerprint held across the claim costs deliveries without one nothing.
        let fingerprint = fingerprints.map(|f| Box::new(f.of(&parts, Some(body.buffered_bytes()))));
        let attempt = shared
            .claims
            .journal
            .as_ref()
            .and_then(|_| attempt_of(&parts));
        let mut guard = match claimed(&shared, &key, fingerprint.as_deref()).await {
            Ok(guard) => guard,
            Err(mut answer) => {
                journaled(&shared, &key, attempt, &answer);
                answer.extensions_mut().insert(key);
                return Ok(answer);
            }
        };
        if let Some(fingerprint) = fingerprint {
            guard.fingerprint(*fingerprint);
        }
        let keep = Keeper(shared.capture.clone());
        let request = Request::from_parts(parts, body);
        let mut res = match Detach::new(run(guard, inner, request, keep)).await {
            Ok(answer) => answer,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        if let Ok(res) = &mut res {
            journaled(&shared, &key, attempt, res);
            res.extensions_mut().insert(key);
        }
        res
    }
}

/// Notes the delivery's outcome in the layer's journal, if it keeps one.
fn journaled<St, K, B>(
    shared: &Shared<St, K>,
    key: &IdempotencyKey,
    attempt: Option<u32>,
    res: &Response<B>,
) {
    if let (Some(journal), Some(outcome)) = (&shared.claims.journal, res.extensions().get()) {
        journal.record(key, *outcome, attempt);
    }
}

/// Claims a delivery's key: the guard of a granted claim, or the layer's own answer
/// (draining, duplicate, in flight, held, store unavailable).
async fn claimed<St, K, B>(
    shared: &Arc<Shared<St, K>>,
    key: &IdempotencyKey,
    fingerprint: Option<&Fingerprint>,
) -> Result<LeaseGuard<Shared<St, K>>, Response<ResponseBody<B>>>
where
    St: Store,
    K: ExtractKey,
{
    let settings = &shared.settings;
    let mut claimed = claim(shared, key).await;
    if let (Ok(Answer::InFlight(_)), Some(wait)) = (&claimed, shared.claims.wait_in_flight) {
        let until = crate::engine::later(tokio::time::Instant::now(), wait);
        let (stale, timeout) = (shared.claims.stale, settings.store_timeout);
        if wait::settled(&shared.store, &settings.drain, key, stale, timeout, until).await {
            claimed = claim(shared, key).await;
        }
    }
    let guard = match claimed {
        Ok(Answer::Acquired(guard)) => guard,
        Ok(Answer::Draining) => {
            record(key, Outcome::Draining);
            return Err(response::draining(settings.retry_after));
        }
        Ok(Answer::Done(done)) => return Err(duplicate(shared, key, fingerprint, &done)),
        Ok(Answer::InFlight(pending)) => {
            record(key, Outcome::InFlight);
            tracing::trace!(age = ?pending.age, deliveries = pending.deliveries, "claim in flight");
            return Err(response::in_flight(settings.retry_after));
        }
        Ok(Answer::Held(pending)) => {
            record(key, Outcome::Held);
            tracing::warn!(
                namespace = key.namespace(),
                key = key.value(),
                age = ?pending.age,
                since_renewal = ?pending.since_renewal,
                deliveries = pending.deliveries,
                "stale claim held for review: resolve it with Store::resolve",
            );
            if let Some(hook) = &shared.claims.on_held {
                hook(key, &pending);
            }
            return Err(response::held());
        }
        Err(error) => {
            record(key, Outcome::StoreUnavailable);
            tracing::error!(
                namespace = key.namespace(),
                key = key.value(),
                error = &error as &dyn std::error::Error,
                "claim failed; the handler does not run",
            );
            return Err(response::store_unavailable(settings.retry_after));
        }
    };
    let lease = guard.lease();
    if lease.reclaimed() {
        tracing::warn!(
            namespace = key.namespace(),
            key = key.value(),
            lease = %lease.token(),
            "reclaimed a stale claim: the earlier delivery's owner stopped renewing it, and may \
             or may not have done its work",
        );
    }
    Ok(guard)
}

/// The answer to a duplicate of a done key: 422 if it reuses the key for another request,
/// the stored answer if there is one to replay, else the plain 200.
fn duplicate<St, K, B>(
    shared: &Shared<St, K>,
    key: &IdempotencyKey,
    fingerprint: Option<&Fingerprint>,
    done: &Completed,
) -> Response<ResponseBody<B>> {
    let receipt = done.receipt.as_deref();
    let kept = receipt.and_then(|receipt| receipt.fingerprint.as_ref());
    if let (Some(ours), Some(kept)) = (fingerprint, kept)
        && ours != kept
    {
        record(key, Outcome::KeyReused);
        tracing::debug!(
            deliveries = done.deliveries,
            "key reused for another request; answered 422"
        );
        return response::key_reused();
    }
    let stored = receipt.and_then(|receipt: &Receipt| receipt.response.as_ref());
    if let (Some(_), Some(stored)) = (&shared.claims.replay, stored) {
        record(key, Outcome::Replayed);
        tracing::trace!(
            deliveries = done.deliveries,
            "duplicate answered with its stored answer"
        );
        return response::replayed(stored);
    }
    record(key, Outcome::Duplicate);
    tracing::trace!(
        deliveries = done.deliveries,
        "duplicate of a processed event"
    );
    response::duplicate()
}

/// What a claim answered, with a granted claim already under its guard.
enum Answer<St: Store, K: ExtractKey> {
    Acquired(LeaseGuard<Shared<St, K>>),
    Done(Completed),
    InFlight(Pending),
    Held(Pending),
    /// The layer drains: no new claims.
    Draining,
}

/// Claims `key` within the store timeout (see [`acquire`]), unless the layer drains.
async fn claim<St: Store, K: ExtractKey>(
    shared: &Arc<Shared<St, K>>,
    key: &IdempotencyKey,
) -> Result<Answer<St, K>, StoreError> {
    let Some(entry) = shared.settings.drain.enter() else {
        return Ok(Answer::Draining);
    };
    let owner = shared.clone();
    let key = key.clone();
    let claiming = async move {
        let claim = owner.store.claim(&key, owner.claims.stale).await?;
        Ok(answer(owner, claim, entry))
    };
    let started = crate::engine::observe::started();
    let answer = acquire(claiming, shared.settings.store_timeout, "claim").await;
    if let Some(started) = started {
        crate::metrics::store_call("claim", started.elapsed());
    }
    answer
}

fn answer<St: Store, K: ExtractKey>(
    owner: Arc<Shared<St, K>>,
    claim: Claim,
    entry: Entry,
) -> Answer<St, K> {
    match claim {
        Claim::Acquired(lease) => Answer::Acquired(LeaseGuard::claimed(owner, lease, entry)),
        Claim::Done(done) => Answer::Done(done),
        Claim::InFlight(pending) => Answer::InFlight(pending),
        Claim::Held(pending) => Answer::Held(pending),
    }
}

impl<St: Store, K: ExtractKey> Owner for Shared<St, K> {
    type Lease = Lease;
    const WHAT: &'static str = "claim";

    fn settings(&self) -> &Settings {
        &self.settings
    }

    fn stale(&self) -> Stale {
        self.claims.stale
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        self.store.renew(lease).await
    }

    async fn settle(
        &self,
        lease: &Lease,
        action: Settle,
        receipt: Option<&Receipt>,
    ) -> Result<(), StoreError> {
        match (action, receipt) {
            (Settle::Commit, Some(receipt)) => self.store.commit_with(lease, receipt).await,
            (Settle::Commit, None) => self.store.commit(lease).await,
            (Settle::Release, _) => self.store.release(lease).await,
            (Settle::GiveBack, _) => self.store.give_back(lease).await,
        }
    }

    fn report(lease: &Lease, action: Settle, result: &Result<(), StoreError>) {
        let key = lease.key();
        tracing::debug!(
            namespace = key.namespace(),
            key = key.value(),
            outcome = action.outcome_of(result).as_str(),
            lease = %lease.token(),
            settled = result.is_ok(),
            "delivery",
        );
        match (result, action) {
            (Ok(()), _) => {}
            (Err(StoreError::LeaseLost), _) => tracing::warn!(
                namespace = key.namespace(),
                key = key.value(),
                lease = %lease.token(),
                action = ?action,
                "lost the lease: another delivery took over this claim; nothing was changed",
            ),
            (Err(error), Settle::Commit) => tracing::error!(
                namespace = key.namespace(),
                key = key.value(),
                lease = %lease.token(),
                error = error as &dyn std::error::Error,
                "commit failed after the handler succeeded; it is retried in the background",
            ),
            (Err(error), Settle::Release | Settle::GiveBack) => tracing::error!(
                namespace = key.namespace(),
                key = key.value(),
                lease = %lease.token(),
                error = error as &dyn std::error::Error,
                "release failed; it is retried in the background",
            ),
        }
    }
}

/// The settings only claim-then-commit has.
#[derive(Clone, Default)]
pub(crate) struct ClaimSettings {
    pub(crate) stale: Stale,
    pub(crate) on_held: Option<HeldHook>,
    pub(crate) wait_in_flight: Option<Duration>,
    pub(crate) replay: Option<Arc<Replay>>,
    pub(crate) fingerprint: Option<Arc<RequestFingerprint>>,
    pub(crate) journal: Option<Journal>,
}

impl fmt::Debug for ClaimSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimSettings")
            .field("stale", &self.stale)
            .field("on_held", &self.on_held.is_some())
            .field("wait_in_flight", &self.wait_in_flight)
            .field("replay", &self.replay)
            .field("fingerprint", &self.fingerprint)
            .field("journal", &self.journal)
            .finish()
    }
}
