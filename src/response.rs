//! The answers the layer gives itself, and the [`Outcome`] of every delivery.
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
use crate::key::KeyError;

/// The header naming the outcome on the layer's own answers, e.g. `idempotency-outcome:
/// duplicate`.
pub const OUTCOME_HEADER: HeaderName = HeaderName::from_static("idempotency-outcome");

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

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
}

impl Outcome {
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
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub(crate) fn duplicate<B>() -> Response<ResponseBody<B>> {
    answer(StatusCode::OK, Outcome::Duplicate, Bytes::new())
}

/// A duplicate answered with the stored answer of the delivery that committed its key.
pub(crate) fn replayed<B>(stored: &crate::store::StoredResponse) -> Response<ResponseBody<B>> {
    let mut res = answer(stored.status, Outcome::Replayed, stored.body.clone());
    for (name, value) in &stored.headers {
        // The store kept only allowed headers; a receipt written by other code may not have.
        if !crate::replay::never_replayed(name) {
            res.headers_mut().append(name.clone(), value.clone());
        }
    }
    res.headers_mut().insert(
        crate::replay::REPLAYED_HEADER,
        HeaderValue::from_static("true"),
    );
    res
}

/// A key used before for a request with another fingerprint: 422, as the `Idempotency-Key`
/// draft asks.
pub(crate) fn key_reused<B>() -> Response<ResponseBody<B>> {
    problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        Outcome::KeyReused,
        "this idempotency key was used before for a different request (method, path or body); \
         a new request needs a new key",
        None,
    )
}

/// The handler succeeded, but its answer failed while it was read to be stored: 500, the key
/// committed without it.
pub(crate) fn unreadable_answer<B>() -> Response<ResponseBody<B>> {
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        Outcome::Processed,
        "the request was processed, but its answer failed while it was read and is lost; a \
         retry with the same key is answered 200 without a body",
        None,
    )
}

pub(crate) fn outdated<B>() -> Response<ResponseBody<B>> {
    answer(StatusCode::OK, Outcome::Outdated, Bytes::new())
}

pub(crate) fn in_flight<B>(retry_after: Duration) -> Response<ResponseBody<B>> {
    let mut res = problem(
        StatusCode::CONFLICT,
        Outcome::InFlight,
        "another delivery of this event is being processed; retry later",
        None,
    );
    set_retry_after(&mut res, retry_after);
    res
}

/// The [version guard](crate::version_guard)'s answer while another version of the entity is applied.
pub(crate) fn entity_busy<B>(retry_after: Duration) -> Response<ResponseBody<B>> {
    let mut res = problem(
        StatusCode::CONFLICT,
        Outcome::InFlight,
        "another version of this entity is being applied; retry later",
        None,
    );
    set_retry_after(&mut res, retry_after);
    res
}

/// The [version guard](crate::version_guard)'s answer when a stale pending version is held for review.
pub(crate) fn entity_held<B>() -> Response<ResponseBody<B>> {
    problem(
        StatusCode::CONFLICT,
        Outcome::Held,
        "an earlier version of this entity did not finish applying; it is held for review",
        None,
    )
}

pub(crate) fn held<B>() -> Response<ResponseBody<B>> {
    problem(
        StatusCode::CONFLICT,
        Outcome::Held,
        "an earlier delivery of this event did not finish; it is held for review",
        None,
    )
}

pub(crate) fn rejected<B>(error: &KeyError) -> Response<ResponseBody<B>> {
    let expected = match error {
        KeyError::Missing { expected } => Some(&**expected),
        _ => None,
    };
    let mut res = problem(
        error.status(),
        Outcome::Rejected,
        &error.to_string(),
        expected,
    );
    if *error == KeyError::BodyTimeout {
        // The rest of the body may still be on its way: the connection cannot be reused.
        res.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    res.extensions_mut().insert(error.clone());
    res
}

/// A delivery whose signature did not verify: 401, the store untouched.
#[cfg(feature = "verify")]
pub(crate) fn unverified<B>(error: &crate::verify::VerifyError) -> Response<ResponseBody<B>> {
    let expected = match error {
        crate::verify::VerifyError::Missing { expected } => Some(&**expected),
        _ => None,
    };
    let mut res = problem(
        StatusCode::UNAUTHORIZED,
        Outcome::Unverified,
        &error.to_string(),
        expected,
    );
    res.extensions_mut().insert(error.clone());
    res
}

/// A delivery the [version guard](crate::version_guard) cannot order: no usable entity id or version, or
/// an unreadable body.
pub(crate) fn unordered<B>(
    error: &crate::version_guard::VersionGuardError,
) -> Response<ResponseBody<B>> {
    let mut res = problem(
        error.status(),
        Outcome::Rejected,
        &error.to_string(),
        error.expected(),
    );
    if error.status() == StatusCode::REQUEST_TIMEOUT {
        res.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    res.extensions_mut().insert(error.clone());
    res
}

pub(crate) fn store_unavailable<B>(retry_after: Duration) -> Response<ResponseBody<B>> {
    let mut res = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        Outcome::StoreUnavailable,
        "the idempotency store is unavailable; the event was not processed",
        None,
    );
    set_retry_after(&mut res, retry_after);
    res
}

pub(crate) fn draining<B>(retry_after: Duration) -> Response<ResponseBody<B>> {
    let mut res = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        Outcome::Draining,
        "the service is shutting down; the event was not processed",
        None,
    );
    set_retry_after(&mut res, retry_after);
    res
}

fn problem<B>(
    status: StatusCode,
    outcome: Outcome,
    detail: &str,
    expected: Option<&str>,
) -> Response<ResponseBody<B>> {
    let mut body = serde_json::json!({
        "title": status.canonical_reason().unwrap_or_default(),
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(expected) = expected {
        body["expected"] = expected.into();
    }
    let mut res = answer(status, outcome, Bytes::from(body.to_string()));
    res.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    res
}

fn answer<B>(status: StatusCode, outcome: Outcome, body: Bytes) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::bytes(body));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(OUTCOME_HEADER, HeaderValue::from_static(outcome.as_str()));
    res.extensions_mut().insert(outcome);
    res
}

fn set_retry_after<B>(res: &mut Response<B>, after: Duration) {
    // Rounded up, and never overflowing whatever the configured duration.
    let seconds = after
        .as_secs()
        .saturating_add(u64::from(after.subsec_nanos() > 0));
    res.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
}
