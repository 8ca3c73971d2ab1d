//! The one service shell: every mode's deliveries go through [`Guarded`], and a mode is a
//! small type that says what it claims, how, and how a held claim runs and settles.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_service::Service;

use super::handback::{in_front_or_behind, run_reported};
use super::observe::ResponseFuture;
use super::observe::observed;
use super::run::{Detach, detached_run};
use crate::body::{BoxError, RequestBody, ResponseBody};

// What a mode is made of, from one path: the pieces of the engine a mode's files (its
// `layer.rs` and `mode.rs`, and the inbox's worker) use.
pub(crate) use super::MissingKey;
pub(crate) use super::drain::Ticket;
#[cfg(feature = "_sql")]
pub(crate) use super::guard::MarkerGuard;
pub(crate) use super::guard::{LeaseGuard, Leased, Owner, Settle};
pub(crate) use super::handback::{HandBack, HandedBack, Reach, Report, panic_message};
pub(crate) use super::observe::record;
pub(crate) use super::refusal::{Refusal, Rejection};
pub(crate) use super::run::{Nothing, Ran, acquire, call, heartbeat, run};
pub(crate) use super::settings::{Configured, HeldHook, Settings, shared_settings};
pub(crate) use super::wait;
use crate::key::{ExtractKey, IdempotencyKey, KeyError};
use crate::response::{Outcome, with_outcome};

/// A way of guarding deliveries: claim-then-commit, transactional, the version guard.
///
/// The shell ([`Guarded`]) takes a delivery through the steps every mode shares: buffer the
/// body when the mode or verification needs it, verify, find what to claim, count the
/// delivery in the drain, claim, run the inner service under the claim (to completion, in a
/// task of its own if the delivery goes away), and answer. A mode says what happens at each
/// step of its own.
pub(crate) trait Mode<S, B, ResB>: Configured + Send + Sync + Sized + 'static
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>>,
{
    /// What a delivery claims, once found: its key, or an entity and its version; with what
    /// the mode keeps of the request for later (a fingerprint, the sender's attempt).
    type Found: Send + Sync + 'static;
    /// A granted claim, held until the run settles it: a lease guard, an open transaction.
    type Held: Send + 'static;

    /// What this mode does with a delivery an inbox worker sends back through the app (see
    /// [`handback`](super::handback)): a guard in front of the route lets it through, one
    /// behind the route's layer guards it. The inbox's ingest, the route's own layer, runs it.
    fn handed_back(&self, hand_back: &HandBack) -> HandedBack {
        in_front_or_behind(hand_back)
    }

    /// The text a handed-back delivery's report gives for the inner service's error.
    fn describe_error(error: &S::Error) -> String {
        let _ = error;
        "the service returned an error".to_owned()
    }

    /// Whether finding what to claim reads the body of this request (buffered then).
    fn reads_body(&self, parts: &Parts) -> bool;

    /// What to answer when the body could not be buffered.
    fn body_refused(&self, error: KeyError) -> Rejection {
        Rejection::Key(error)
    }

    /// Finds what the delivery claims, from its head and (when read) its body. `Ok(None)`:
    /// nothing, and the layer lets such deliveries through unguarded.
    fn find(&self, parts: &Parts, body: Option<&Bytes>) -> Result<Option<Self::Found>, Rejection>;

    /// Claims it, bounded by the store timeout: a granted claim, held by what settles it, or
    /// what to answer instead. `entry` counts the delivery in the drain until it settles.
    fn claim(
        self: Arc<Self>,
        found: &Self::Found,
        entry: Ticket,
    ) -> impl Future<Output = Result<Self::Held, Refusal>> + Send;

    /// Runs the inner service under the claim, and settles it as the answer says.
    fn run(
        self: Arc<Self>,
        held: Self::Held,
        inner: S,
        request: Request<RequestBody<B>>,
    ) -> impl Future<Output = Ran<Response<ResponseBody<ResB>>, S::Error>> + Send + 'static;

    /// Tells of an answer the layer gave itself after finding what to claim.
    fn record(&self, found: &Self::Found, outcome: Outcome);

    /// Adds what the mode tells of a delivery to its answer, whoever made it (the key in the
    /// extensions, the journal).
    fn answered(&self, found: Self::Found, res: &mut Response<ResponseBody<ResB>>);
}

/// The service of every mode, made by its layer and named after it:
/// [`Idempotency`](crate::Idempotency) for claim-then-commit,
/// [`VersionGuard`](crate::version_guard::VersionGuard), `transactional::Transactional` (with a
/// SQL store's feature) and [`Ingest`](crate::inbox::Ingest) for the inbox. Each mode is a
/// folder of the same shape: `layer.rs` (the layer `XLayer`, the service alias `X`) and
/// `mode.rs` (its mode type, `XMode`), beside what is its own.
///
/// The inner service receives `Request<RequestBody<B>>` and its error type is kept: the
/// layer's own outcomes (duplicate, in flight, bad key, store down) are responses.
///
/// Once a delivery holds its claim, the inner service's future runs to its end whether or not
/// anybody still waits for the answer: if the response future is dropped (hyper drops it when
/// the client disconnects), the inner future moves into a task of its own, and its answer
/// still settles the claim. So a timeout layer outside this one bounds how long the sender
/// waits, not how long the claimed work runs: bound that inside the handler.
///
/// `poll_ready` is always ready: the inner service is driven to readiness inside the response
/// future, once the delivery holds a claim, so that a slow upload or a duplicate answered by
/// the layer never occupies a slot of a concurrency limit further in.
pub struct Guarded<S, M> {
    inner: S,
    mode: Arc<M>,
}

impl<S, M> Guarded<S, M> {
    pub(crate) fn new(inner: S, mode: Arc<M>) -> Self {
        Self { inner, mode }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, to change.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, this shell dropped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, M> Clone for Guarded<S, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            mode: self.mode.clone(),
        }
    }
}

impl<S: fmt::Debug, M: fmt::Debug> fmt::Debug for Guarded<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("inner", &self.inner)
            .field("mode", &self.mode)
            .finish()
    }
}

#[allow(
    private_bounds,
    reason = "the modes are the crate's own; users name the services by their aliases"
)]
impl<S, M, ReqB, ResB> Service<Request<ReqB>> for Guarded<S, M>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    M: Mode<S, ReqB, ResB>,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Send + 'static,
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
        observed(Box::pin(deliver(self.mode.clone(), inner, parts, body)))
    }
}

/// One delivery, from what it claims to its answer.
///
/// The head of the request stays where it came in until the request goes on to the inner
/// service: a future that moved it along would hold it twice. So too this is a function
/// answering an `async move` block, not an `async fn`, which keeps its arguments twice (as
/// passed, and moved into its body). The smaller the future, the cheaper its box.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn holds its arguments twice"
)]
fn deliver<S, M, ReqB, ResB>(
    mode: Arc<M>,
    inner: S,
    parts: Parts,
    body: ReqB,
) -> impl Future<Output = Result<Response<ResponseBody<ResB>>, S::Error>> + Send
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    M: Mode<S, ReqB, ResB>,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Send + 'static,
{
    async move {
        if let Some(hand_back) = parts.extensions.get::<HandBack>() {
            match mode.handed_back(hand_back) {
                HandedBack::Guard => {}
                HandedBack::PassThrough => {
                    let request = Request::from_parts(parts, RequestBody::new(body));
                    return Box::pin(pass_through(inner, request)).await;
                }
                HandedBack::Run(reporter) => {
                    let request = Request::from_parts(parts, RequestBody::new(body));
                    let run = run_reported(inner, request, reporter, M::describe_error);
                    return Box::pin(run).await;
                }
                HandedBack::Refuse => {
                    let busy = "this delivery was handed back to its route after its worker \
                                stopped waiting for it";
                    return Ok(Refusal::InFlight(busy).answer(mode.settings().retry_after));
                }
            }
        }
        let settings = mode.settings();
        let retry_after = settings.retry_after;
        let reads = mode.reads_body(&parts);
        let needed = reads || verifies(settings);
        let (bytes, body) = match take_body(needed, &parts, body, settings).await {
            Ok(taken) => taken,
            Err(error) => {
                return Ok(Refusal::Rejected(mode.body_refused(error)).answer(retry_after));
            }
        };
        if let Err(refused) = verified(settings, &parts, bytes.as_deref()) {
            return Ok(Refusal::Rejected(refused).answer(retry_after));
        }
        let found = match mode.find(&parts, bytes.as_ref().filter(|_| reads)) {
            Ok(Some(found)) => found,
            Ok(None) => {
                // Boxed: the handler's future is no part of the guarded deliveries' futures.
                let unguarded = pass_through(inner, Request::from_parts(parts, body));
                return Box::pin(unguarded).await;
            }
            Err(rejection) => return Ok(Refusal::Rejected(rejection).answer(retry_after)),
        };
        drop(bytes);
        let claimed = match settings.drain.enter() {
            Some(entry) => mode.clone().claim(&found, entry).await,
            None => Err(Refusal::Draining),
        };
        let mut res = match claimed {
            Ok(held) => {
                let run = mode
                    .clone()
                    .run(held, inner, Request::from_parts(parts, body));
                match Detach::new(run, detached_run).await {
                    Ok(Ok(res)) => res,
                    Ok(Err(error)) => return Err(error),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            Err(refusal) => {
                mode.record(&found, refusal.outcome());
                refusal.answer(retry_after)
            }
        };
        mode.answered(found, &mut res);
        Ok(res)
    }
}

// Before the claim: the body buffered only when it must be, the signature, the key.

/// Finds a delivery's key with `extractor` (given the body when it reads it), checks its
/// length, joins the scope, and decides what happens to a delivery without one: `Ok(None)`
/// lets it through unguarded, when the layer says so.
pub(crate) fn find_key<K: ExtractKey>(
    extractor: &K,
    settings: &Settings,
    parts: &Parts,
    body: Option<&Bytes>,
) -> Result<Option<IdempotencyKey>, Rejection> {
    let body = body.filter(|_| extractor.reads_body(parts));
    let key = extractor.extract(parts, body.map(|b| &b[..]));
    match check_len(key, settings).and_then(|key| settings.scope.apply(key, parts)) {
        Ok(key) => {
            super::observe::keyed(&key);
            Ok(Some(key))
        }
        Err(KeyError::Missing { .. }) if settings.missing_key == MissingKey::PassThrough => {
            Ok(None)
        }
        Err(error) => Err(error.into()),
    }
}

/// Whether the layer verifies signatures, and so must buffer every body.
pub(crate) fn verifies(settings: &Settings) -> bool {
    #[cfg(feature = "verify")]
    return settings.verify.is_some();
    #[cfg(not(feature = "verify"))]
    {
        let _ = settings;
        false
    }
}

/// Checks the signature, if the layer verifies them; `body` was buffered when it does. The
/// store has not been touched yet, and is not when this fails.
pub(crate) fn verified(
    settings: &Settings,
    parts: &Parts,
    body: Option<&[u8]>,
) -> Result<(), Rejection> {
    #[cfg(feature = "verify")]
    if let Some(verification) = &settings.verify {
        let body = body.unwrap_or_default();
        return verification
            .0
            .verify(parts, body)
            .map_err(Rejection::Signature);
    }
    let _ = (settings, parts, body);
    Ok(())
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

/// Buffers the body through the limit and the time limit when `needed`, and answers the bytes
/// with the body to pass on: the buffered bytes, or the original body untouched.
pub(crate) async fn take_body<B>(
    needed: bool,
    parts: &Parts,
    body: B,
    settings: &Settings,
) -> Result<(Option<Bytes>, RequestBody<B>), KeyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    if !needed {
        return Ok((None, RequestBody::new(body)));
    }
    // Boxed: a delivery whose body stays unread does not carry the reading in its future.
    let bytes = Box::pin(buffer(parts, body, settings)).await?;
    Ok((Some(bytes.clone()), RequestBody::buffered(bytes)))
}

async fn buffer<B>(parts: &Parts, body: B, settings: &Settings) -> Result<Bytes, KeyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let limit = settings.body_limit;
    let too_large = KeyError::BodyTooLarge { limit };
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large);
    }
    let collect = Limited::new(body, limit).collect();
    match tokio::time::timeout(settings.body_timeout, collect).await {
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
    settings: &Settings,
) -> Result<IdempotencyKey, KeyError> {
    let key = key?;
    if key.value().len() > settings.max_key_len {
        return Err(KeyError::invalid(format!(
            "the key is {} bytes long; at most {} are allowed",
            key.value().len(),
            settings.max_key_len
        )));
    }
    Ok(key)
}
