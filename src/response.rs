//! The [`Outcome`] of every delivery, and the shape of the answers the layer gives itself.
//!
//! Every response that passes through the layer carries its [`Outcome`] in the response
//! extensions, and, once a key was found, the [`IdempotencyKey`](crate::IdempotencyKey): what
//! an access log needs. The answers the layer makes itself also name it in the
//! [`idempotency-outcome`](OUTCOME_HEADER) header; errors are `application/problem+json`
//! (RFC 9457).
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::{IdempotencyLayer, Outcome, key, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::github()))
//!     .service(service_fn(|_req| async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }));
//!
//! // A GitHub delivery without its delivery header.
//! let res = svc.oneshot(Request::post("/").body(String::new()).unwrap()).await.unwrap();
//! assert_eq!(res.status(), StatusCode::BAD_REQUEST);
//! assert_eq!(res.headers()["content-type"], "application/problem+json");
//! assert_eq!(res.extensions().get::<Outcome>(), Some(&Outcome::Rejected));
//! # }
//! ```

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Response, StatusCode};

use crate::body::ResponseBody;

/// The header naming the outcome on the layer's own answers, e.g. `idempotency-outcome:
/// duplicate`.
pub const OUTCOME_HEADER: HeaderName = HeaderName::from_static("idempotency-outcome");

/// The media type of a problem document.
pub(crate) const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// What happened to a delivery. Found in the extensions of every response of the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and succeeded: the key is `done`, or its commit failed and is being
    /// retried in the background (a warning says so).
    Processed,
    /// The handler ran and failed; the claim was released so a retry runs it again (or the
    /// release is being retried in the background).
    Released,
    /// The event was processed already: answered 200 without running the handler.
    Duplicate,
    /// Another delivery of the event is being processed: answered 409 with `Retry-After`.
    InFlight,
    /// A stale claim held for a person: answered 409.
    Held,
    /// No usable key, or an unreadable body: answered 4xx.
    Rejected,
    /// The store failed: answered 503 with `Retry-After`; the handler did not run.
    StoreUnavailable,
    /// No key, and the layer was told to let such requests through unguarded.
    PassedThrough,
    /// The [version guard](crate::version_guard) found that the entity is at this delivery's version or
    /// a newer one already: answered 200 without running the handler.
    Outdated,
    /// The layer is draining for shutdown ([`Drain`](crate::Drain)): answered 503 with
    /// `Retry-After`, the handler did not run.
    Draining,
    /// The signature was missing, malformed, wrong or too old (the `verify` feature): answered
    /// 401; nothing was claimed and the handler did not run.
    Unverified,
    /// The event was processed already, and the answer it got was stored ([response
    /// replay](crate::replay)): answered with that answer again, without running the handler.
    Replayed,
    /// The key was used before for another request (its [fingerprint](crate::replay)
    /// differs): answered 422 without running the handler.
    KeyReused,
    /// The handler ran, but by the time it settled another delivery had taken its claim over
    /// (the claim went unrenewed for the stale limit, or a person resolved it): its commit or
    /// release changed nothing, and the handler's own answer went out. A warning says so.
    LeaseLost,
    /// The [inbox](crate::inbox) stored the delivery durably for its workers: answered 202
    /// (or the status the inbox was given); the handler runs later, off the request path.
    Queued,
}

impl Outcome {
    /// Every outcome, in the order of the enum.
    #[cfg(feature = "ledger")]
    pub(crate) const ALL: [Self; 15] = [
        Self::Processed,
        Self::Released,
        Self::Duplicate,
        Self::InFlight,
        Self::Held,
        Self::Rejected,
        Self::StoreUnavailable,
        Self::PassedThrough,
        Self::Outdated,
        Self::Draining,
        Self::Unverified,
        Self::Replayed,
        Self::KeyReused,
        Self::LeaseLost,
        Self::Queued,
    ];

    /// The outcome named `name` ([`as_str`](Self::as_str)).
    #[cfg(feature = "ledger")]
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|outcome| outcome.as_str() == name)
    }

    /// The outcome's name, as in logs and the [`OUTCOME_HEADER`].
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Processed => "processed",
            Self::Released => "released",
            Self::Duplicate => "duplicate",
            Self::InFlight => "in-flight",
            Self::Held => "held",
            Self::Rejected => "rejected",
            Self::StoreUnavailable => "store-unavailable",
            Self::PassedThrough => "passed-through",
            Self::Outdated => "outdated",
            Self::Draining => "draining",
            Self::Unverified => "unverified",
            Self::Replayed => "replayed",
            Self::KeyReused => "key-reused",
            Self::LeaseLost => "lease-lost",
            Self::Queued => "queued",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A problem document (RFC 9457) of `status`: its title, status and detail, to which a caller
/// may add members of its own. The one place the crate writes one.
pub(crate) fn problem_document(status: StatusCode, detail: &str) -> serde_json::Value {
    serde_json::json!({
        "title": status.canonical_reason().unwrap_or_default(),
        "status": status.as_u16(),
        "detail": detail,
    })
}

/// The body of a problem+json answer: the [document](problem_document), and what was
/// expected where the layer knows it.
pub(crate) fn problem_json(status: StatusCode, detail: &str, expected: Option<&str>) -> Bytes {
    let mut body = problem_document(status, detail);
    if let Some(expected) = expected {
        body["expected"] = expected.into();
    }
    Bytes::from(body.to_string())
}

/// A problem+json answer of the layer's own, naming its outcome.
pub(crate) fn problem(
    status: StatusCode,
    outcome: Outcome,
    detail: &str,
    expected: Option<&str>,
) -> Response<Bytes> {
    problem_as(status, outcome, detail, expected, |body| body)
}

/// [`problem`], its body made into the body type of the response at once.
pub(crate) fn problem_as<T>(
    status: StatusCode,
    outcome: Outcome,
    detail: &str,
    expected: Option<&str>,
    body: impl FnOnce(Bytes) -> T,
) -> Response<T> {
    let mut res = answer(
        status,
        outcome,
        body(problem_json(status, detail, expected)),
    );
    res.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    res
}

/// An answer of the layer's own: `status`, `body`, and its outcome in the header and the
/// extensions.
pub(crate) fn answer<T>(status: StatusCode, outcome: Outcome, body: T) -> Response<T> {
    let mut res = Response::new(body);
    *res.status_mut() = status;
    res.headers_mut()
        .insert(OUTCOME_HEADER, HeaderValue::from_static(outcome.as_str()));
    res.extensions_mut().insert(outcome);
    res
}

/// `Retry-After` in whole seconds, rounded up, at least one, never overflowing whatever the
/// configured duration.
pub(crate) fn set_retry_after<B>(res: &mut Response<B>, after: Duration) {
    let seconds = after
        .as_secs()
        .saturating_add(u64::from(after.subsec_nanos() > 0));
    res.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
}

/// Tags the inner service's response with the delivery's outcome, unless a layer further in
/// (the version guard) already named a more specific one.
pub(crate) fn with_outcome<B>(res: Response<B>, outcome: Outcome) -> Response<ResponseBody<B>> {
    tagged(res.map(ResponseBody::new), outcome)
}

/// [`with_outcome`] for a response whose body is the layer's already.
pub(crate) fn tagged<B>(
    mut res: Response<ResponseBody<B>>,
    outcome: Outcome,
) -> Response<ResponseBody<B>> {
    if res.extensions().get::<Outcome>().is_none() {
        res.extensions_mut().insert(outcome);
    }
    res
}

/// Which inner responses commit: a predicate on the status. By default, 2xx.
#[derive(Clone)]
pub(crate) struct CommitWhen(pub(crate) std::sync::Arc<dyn Fn(StatusCode) -> bool + Send + Sync>);

impl CommitWhen {
    pub(crate) fn commits(&self, status: StatusCode) -> bool {
        (self.0)(status)
    }
}

impl Default for CommitWhen {
    fn default() -> Self {
        Self(std::sync::Arc::new(|status: StatusCode| {
            status.is_success()
        }))
    }
}

impl std::fmt::Debug for CommitWhen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitWhen(..)")
    }
}
