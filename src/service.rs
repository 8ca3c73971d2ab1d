use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_service::Service;

use crate::body::{RequestBody, ResponseBody};
use crate::future::ResponseFuture;
use crate::key::{Auto, ExtractKey, IdempotencyKey, KeyError};
use crate::layer::{Config, MissingKey};
use crate::response::{self, Outcome};
use crate::store::{Claim, Lease, LeaseToken, StalePolicy, Store, StoreError};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The service made by [`IdempotencyLayer`](crate::IdempotencyLayer): claim, run the inner
/// service, then commit or release.
///
/// The inner service receives `Request<RequestBody<B>>` and its error type is kept: the
/// layer's own outcomes (duplicate, in flight, bad key, store down) are responses.
pub struct Idempotency<S, St, K = Auto> {
    inner: S,
    shared: Arc<Shared<St, K>>,
}

pub(crate) struct Shared<St, K> {
    pub(crate) store: St,
    pub(crate) key: K,
    pub(crate) config: Config,
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
            .field("config", &self.shared.config)
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
    ResB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, S::Error>;

    /// Always ready: the inner service is driven to readiness inside the response future,
    /// once the delivery holds a claim, so that a slow upload or a duplicate answered by the
    /// layer never occupies a slot of a concurrency limit further in.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let inner = self.inner.clone();
        ResponseFuture::new(Box::pin(deliver(self.shared.clone(), inner, req)))
    }
}

/// One delivery, from key to commit or release.
async fn deliver<S, St, K, ReqB, ResB>(
    shared: Arc<Shared<St, K>>,
    inner: S,
    req: Request<ReqB>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    St: Store,
    K: ExtractKey,
    ReqB: Body<Data = Bytes>,
    ReqB::Error: Into<BoxError>,
{
    let (key, request) = match keyed(&shared, req).await {
        Keyed::Key(key, request) => (key, request),
        Keyed::PassThrough(request) => return pass_through(inner, request).await,
        Keyed::Rejected(error) => return Ok(reject(&error)),
    };
    let mut res = deliver_keyed(&shared, inner, request, &key).await;
    if let Ok(res) = &mut res {
        res.extensions_mut().insert(key);
    }
    res
}

/// One delivery with a valid key: claim, run, commit or release.
async fn deliver_keyed<S, St, K, B, ResB>(
    shared: &Arc<Shared<St, K>>,
    mut inner: S,
    request: Request<B>,
    key: &IdempotencyKey,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    St: Store,
    K: ExtractKey,
{
    let config = &shared.config;
    let lease = match claim(shared, key).await {
        Ok(Claim::Acquired(lease)) => lease,
        Ok(Claim::Done(done)) => {
            record(key, None, Outcome::Duplicate);
            tracing::trace!(
                deliveries = done.deliveries,
                "duplicate of a processed event"
            );
            return Ok(response::duplicate());
        }
        Ok(Claim::InFlight(pending)) => {
            record(key, None, Outcome::InFlight);
            tracing::trace!(age = ?pending.age, deliveries = pending.deliveries, "claim in flight");
            return Ok(response::in_flight(config.retry_after));
        }
        Ok(Claim::Held(pending)) => {
            record(key, None, Outcome::Held);
            tracing::warn!(
                namespace = key.namespace(),
                key = key.value(),
                age = ?pending.age,
                deliveries = pending.deliveries,
                "stale claim held for review: resolve it with Store::resolve",
            );
            if let Some(hook) = &config.on_held {
                hook(key, &pending);
            }
            return Ok(response::held());
        }
        Err(error) => {
            record(key, None, Outcome::StoreUnavailable);
            tracing::error!(
                namespace = key.namespace(),
                key = key.value(),
                error = &error as &dyn std::error::Error,
                "claim failed; the handler does not run",
            );
            return Ok(response::store_unavailable(config.retry_after));
        }
    };
    if lease.reclaimed() {
        tracing::warn!(
            namespace = key.namespace(),
            key = key.value(),
            lease = %lease.token(),
            "reclaimed a stale claim: the earlier delivery's owner may still be running",
        );
    }

    let mut guard = LeaseGuard::new(shared.clone(), lease);
    // `call` runs inside the caught future, so a panic in `call` itself is caught as well.
    let result = AssertUnwindSafe(async move {
        std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
        inner.call(request).await
    })
    .catch_unwind()
    .await;
    match result {
        Ok(Ok(res)) => {
            let outcome = if (config.commit_when)(res.status()) {
                guard.settle(Settle::Commit).await
            } else {
                guard.settle(Settle::Release).await
            };
            Ok(with_outcome(res, outcome))
        }
        Ok(Err(error)) => {
            guard.settle(Settle::Release).await;
            Err(error)
        }
        Err(panic) => {
            guard.abandon().await;
            std::panic::resume_unwind(panic)
        }
    }
}

/// Claims `key` within the store timeout.
///
/// A claim that does not complete at its first poll (a database round trip) finishes in a
/// task of its own. Should the delivery be dropped or time out meanwhile, a claim that landed
/// anyway is released by that task: the handler never ran, so nothing is lost, and no orphaned
/// `processing` row waits for the stale limit.
async fn claim<St: Store, K: ExtractKey>(
    shared: &Arc<Shared<St, K>>,
    key: &IdempotencyKey,
) -> Result<Claim, StoreError> {
    let owner = shared.clone();
    let owned_key = key.clone();
    let claiming = async move { owner.store.claim(&owned_key, owner.config.stale).await };
    let owner = shared.clone();
    let orphaned = move |claim| async move {
        if let Claim::Acquired(lease) = claim {
            let result = owner.store.release(&lease).await;
            tracing::debug!(
                namespace = lease.key().namespace(),
                key = lease.key().value(),
                lease = %lease.token(),
                released = result.is_ok(),
                "the delivery went away during its claim; the claim was released",
            );
        }
    };
    acquire(claiming, shared.config.store_timeout, "claim", orphaned).await
}

/// Runs a store call that may acquire something (a claim, an entity's pending version) within
/// `timeout`.
///
/// A call that does not complete at its first poll (a database round trip) finishes in a task
/// of its own. Should the delivery be dropped or time out meanwhile, whatever the call answered
/// anyway goes to `orphaned`, which gives back what was acquired.
pub(crate) async fn acquire<T, F, O, Fut>(
    acquiring: F,
    timeout: Duration,
    what: &str,
    orphaned: O,
) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, StoreError>> + Send + 'static,
    O: FnOnce(T) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let mut acquiring = Box::pin(acquiring);
    if let Poll::Ready(result) =
        std::future::poll_fn(|cx| Poll::Ready(acquiring.as_mut().poll(cx))).await
    {
        return result;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return acquiring.await;
    };
    let (answer, answered) = tokio::sync::oneshot::channel();
    runtime.spawn(async move {
        if let Err(Ok(acquired)) = answer.send(acquiring.await) {
            orphaned(acquired).await;
        }
    });
    match tokio::time::timeout(timeout, answered).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(StoreError::backend(format!(
            "the {what} task ended without an answer"
        ))),
        Err(_) => Err(StoreError::backend(format!(
            "the store did not answer the {what} within {timeout:?}"
        ))),
    }
}

/// What the key of a delivery decided.
pub(crate) enum Keyed<B> {
    /// A valid key, and the request to pass on.
    Key(IdempotencyKey, Request<RequestBody<B>>),
    /// No key, and the layer lets such requests through unguarded.
    PassThrough(Request<RequestBody<B>>),
    /// An answer of 4xx.
    Rejected(KeyError),
}

/// Finds the delivery's key (buffering the body only if the extractor reads it) and decides
/// what happens to a delivery without one.
pub(crate) async fn keyed<St, K, B>(shared: &Shared<St, K>, req: Request<B>) -> Keyed<B>
where
    K: ExtractKey,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let (key, body) = match find_key(shared, &parts, body).await {
        Ok(found) => found,
        Err(error) => return Keyed::Rejected(error),
    };
    match key {
        Ok(key) => Keyed::Key(key, Request::from_parts(parts, body)),
        Err(KeyError::Missing { .. }) if shared.config.missing_key == MissingKey::PassThrough => {
            Keyed::PassThrough(Request::from_parts(parts, body))
        }
        Err(error) => Keyed::Rejected(error),
    }
}

/// Runs the inner service for a delivery let through without a claim.
pub(crate) async fn pass_through<S, B, ResB>(
    mut inner: S,
    request: Request<B>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResB>>,
{
    tracing::debug!(
        outcome = Outcome::PassedThrough.as_str(),
        "delivery let through unguarded"
    );
    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
    let res = inner.call(request).await?;
    Ok(with_outcome(res, Outcome::PassedThrough))
}

/// Finds the key, buffering the body first if the extractor reads it. The outer error is a
/// body that could not be buffered; the inner one an extractor's verdict.
async fn find_key<St, K, B>(
    shared: &Shared<St, K>,
    parts: &Parts,
    body: B,
) -> Result<(Result<IdempotencyKey, KeyError>, RequestBody<B>), KeyError>
where
    K: ExtractKey,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let config = &shared.config;
    let (bytes, body) = take_body(shared.key.reads_body(parts), parts, body, config).await?;
    let key = shared.key.extract(parts, bytes.as_deref());
    Ok((check_len(key, config), body))
}

/// Buffers the body through the limit and the time limit when `needed` (an extractor reads
/// it), and answers the bytes with the body to pass on: the buffered bytes, or the original
/// body untouched.
pub(crate) async fn take_body<B>(
    needed: bool,
    parts: &Parts,
    body: B,
    config: &Config,
) -> Result<(Option<Bytes>, RequestBody<B>), KeyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    if !needed {
        return Ok((None, RequestBody::new(body)));
    }
    let bytes = buffer(parts, body, config).await?;
    Ok((Some(bytes.clone()), RequestBody::buffered(bytes)))
}

async fn buffer<B>(parts: &Parts, body: B, config: &Config) -> Result<Bytes, KeyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let limit = config.body_limit;
    let too_large = KeyError::BodyTooLarge { limit };
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large);
    }
    let collect = Limited::new(body, limit).collect();
    match tokio::time::timeout(config.body_timeout, collect).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<LengthLimitError>() => Err(too_large),
        Ok(Err(error)) => Err(KeyError::BodyUnreadable {
            detail: error.to_string(),
        }),
        Err(_elapsed) => Err(KeyError::BodyTimeout),
    }
}

pub(crate) fn check_len(
    key: Result<IdempotencyKey, KeyError>,
    config: &Config,
) -> Result<IdempotencyKey, KeyError> {
    let key = key?;
    if key.value().len() > config.max_key_len {
        return Err(KeyError::invalid(format!(
            "the key is {} bytes long; at most {} are allowed",
            key.value().len(),
            config.max_key_len
        )));
    }
    Ok(key)
}

pub(crate) fn reject<B>(error: &KeyError) -> Response<ResponseBody<B>> {
    tracing::debug!(outcome = Outcome::Rejected.as_str(), %error, "delivery rejected");
    response::rejected(error)
}

/// Tags the inner service's response with the delivery's outcome, unless a layer further in
/// (an [`OrderLayer`](crate::order::OrderLayer)) already named a more specific one.
pub(crate) fn with_outcome<B>(res: Response<B>, outcome: Outcome) -> Response<ResponseBody<B>> {
    let mut res = res.map(ResponseBody::new);
    if res.extensions().get::<Outcome>().is_none() {
        res.extensions_mut().insert(outcome);
    }
    res
}

/// The one event every delivery with a key records.
pub(crate) fn record(key: &IdempotencyKey, lease: Option<&Lease>, outcome: Outcome) {
    tracing::debug!(
        namespace = key.namespace(),
        key = key.value(),
        outcome = outcome.as_str(),
        lease = lease.map(|l| tracing::field::display(l.token())),
        "delivery",
    );
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Settle {
    Commit,
    Release,
}

#[derive(Debug, Clone, Copy)]
enum GuardState {
    /// The inner service is running.
    Running,
    /// A commit or release is under way.
    Settling(Settle),
    /// Nothing left to do.
    Settled,
}

/// What a [`LeaseGuard`] holds and settles: a key's claim (this layer), or an entity's pending
/// version (the [order layer](crate::order)).
pub(crate) trait Leases: Send + Sync + 'static {
    /// The lease a successful claim returned.
    type Lease: Clone + Send + Sync + 'static;
    /// What the lease is on, for log lines: "claim", "pending version".
    const WHAT: &'static str;

    fn config(&self) -> &Config;

    /// Commits or releases in the store, once.
    fn settle(
        &self,
        lease: &Self::Lease,
        action: Settle,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Logs how the settlement went, and answers the delivery's outcome.
    fn report(lease: &Self::Lease, action: Settle, result: &Result<(), StoreError>) -> Outcome;

    /// The key (or entity) and fencing token, for log lines.
    fn describe(lease: &Self::Lease) -> (&IdempotencyKey, LeaseToken);
}

impl<St: Store, K: ExtractKey> Leases for Shared<St, K> {
    type Lease = Lease;
    const WHAT: &'static str = "claim";

    fn config(&self) -> &Config {
        &self.config
    }

    async fn settle(&self, lease: &Lease, action: Settle) -> Result<(), StoreError> {
        match action {
            Settle::Commit => self.store.commit(lease).await,
            Settle::Release => self.store.release(lease).await,
        }
    }

    fn report(lease: &Lease, action: Settle, result: &Result<(), StoreError>) -> Outcome {
        report(lease, action, result)
    }

    fn describe(lease: &Lease) -> (&IdempotencyKey, LeaseToken) {
        (lease.key(), lease.token())
    }
}

/// Holds a lease while the inner service runs, and makes sure it is settled even when the
/// response future is dropped half way: hyper drops it when the client disconnects.
pub(crate) struct LeaseGuard<H: Leases> {
    owner: Arc<H>,
    lease: H::Lease,
    state: GuardState,
}

impl<H: Leases> LeaseGuard<H> {
    pub(crate) fn new(owner: Arc<H>, lease: H::Lease) -> Self {
        Self {
            owner,
            lease,
            state: GuardState::Running,
        }
    }

    /// Commits or releases, and answers the delivery's outcome. If the future is dropped
    /// during the store call, `Drop` finishes the same action in a task of its own.
    pub(crate) async fn settle(&mut self, action: Settle) -> Outcome {
        self.state = GuardState::Settling(action);
        let timeout = self.owner.config().store_timeout;
        let result = bounded(self.owner.settle(&self.lease, action), timeout).await;
        self.state = GuardState::Settled;
        H::report(&self.lease, action, &result)
    }

    /// The inner service panicked: under reclaim, release so the retry runs; under hold,
    /// leave the lease to the stale path, since the work may have been half done.
    pub(crate) async fn abandon(&mut self) {
        match self.owner.config().stale.policy() {
            StalePolicy::Reclaim => {
                self.settle(Settle::Release).await;
            }
            StalePolicy::Hold => {
                self.state = GuardState::Settled;
                left_for_hold::<H>(&self.lease, "the handler panicked");
            }
        }
    }
}

impl<H: Leases> Drop for LeaseGuard<H> {
    fn drop(&mut self) {
        let action = match self.state {
            GuardState::Settled => return,
            GuardState::Settling(action) => action,
            GuardState::Running => match self.owner.config().stale.policy() {
                StalePolicy::Reclaim => Settle::Release,
                StalePolicy::Hold => {
                    return left_for_hold::<H>(&self.lease, "the request was dropped mid-flight");
                }
            },
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let (key, token) = H::describe(&self.lease);
            tracing::warn!(
                namespace = key.namespace(),
                key = key.value(),
                lease = %token,
                "no runtime to settle a dropped {}; it is left to the stale path",
                H::WHAT,
            );
            return;
        };
        let owner = self.owner.clone();
        let lease = self.lease.clone();
        runtime.spawn(async move {
            let timeout = owner.config().store_timeout;
            let result = bounded(owner.settle(&lease, action), timeout).await;
            H::report(&lease, action, &result);
        });
    }
}

/// A commit or release, bounded by the store timeout.
async fn bounded(
    call: impl Future<Output = Result<(), StoreError>>,
    timeout: Duration,
) -> Result<(), StoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::backend(format!(
                "the store did not answer within {timeout:?}"
            )))
        })
}

fn report(lease: &Lease, action: Settle, result: &Result<(), StoreError>) -> Outcome {
    let outcome = match action {
        Settle::Commit => Outcome::Processed,
        Settle::Release => Outcome::Released,
    };
    record(lease.key(), Some(lease), outcome);
    let key = lease.key();
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
            "commit failed after the handler succeeded; the claim will turn stale",
        ),
        (Err(error), Settle::Release) => tracing::error!(
            namespace = key.namespace(),
            key = key.value(),
            lease = %lease.token(),
            error = error as &dyn std::error::Error,
            "release failed; the claim will turn stale",
        ),
    }
    outcome
}

fn left_for_hold<H: Leases>(lease: &H::Lease, why: &str) {
    let (key, token) = H::describe(lease);
    tracing::warn!(
        namespace = key.namespace(),
        key = key.value(),
        lease = %token,
        "{why}; under the hold policy the {} stays for review once stale",
        H::WHAT,
    );
}
