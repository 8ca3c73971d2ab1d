//! The answers the layer gives by itself, in every mode: one refusal, one response.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};

use crate::body::ResponseBody;
use crate::key::KeyError;
use crate::response::{Outcome, answer, problem_as, set_retry_after};

/// Why a delivery is answered 4xx before any claim.
pub(crate) enum Rejection {
    /// No usable key, or an unreadable body.
    Key(KeyError),
    /// A missing, malformed, wrong or expired signature: 401.
    #[cfg(feature = "verify")]
    Signature(crate::verify::VerifyError),
    /// A 4xx a mode made itself (the version guard's, for an entity or version it cannot
    /// use), its outcome in its extensions.
    Own(Box<Response<Bytes>>),
}

impl From<KeyError> for Rejection {
    fn from(error: KeyError) -> Self {
        Self::Key(error)
    }
}

/// What the layer answers instead of running the handler.
pub(crate) enum Refusal {
    /// 4xx before any claim.
    Rejected(Rejection),
    /// The layer drains for shutdown: 503 with `Retry-After`.
    Draining,
    /// The event was processed already: 200.
    Duplicate,
    /// An answer a mode made itself (replay's stored answer, its 422 for a reused key), its
    /// outcome in its extensions.
    Own(Box<Response<Bytes>>),
    /// The entity is at this version or a newer one already: 200.
    Outdated,
    /// Another delivery holds the claim: 409 with `Retry-After`, and what it is busy with.
    InFlight(&'static str),
    /// A stale claim the hold policy keeps for a person: 409, and what did not finish.
    Held(&'static str),
    /// The store failed: 503 with `Retry-After`.
    StoreUnavailable,
}

impl Refusal {
    /// The outcome the refusal is recorded with.
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Self::Rejected(Rejection::Key(_)) => Outcome::Rejected,
            Self::Rejected(Rejection::Own(res)) => own(res),
            Self::Own(res) => own(res),
            #[cfg(feature = "verify")]
            Self::Rejected(Rejection::Signature(_)) => Outcome::Unverified,
            Self::Draining => Outcome::Draining,
            Self::Duplicate => Outcome::Duplicate,
            Self::Outdated => Outcome::Outdated,
            Self::InFlight(_) => Outcome::InFlight,
            Self::Held(_) => Outcome::Held,
            Self::StoreUnavailable => Outcome::StoreUnavailable,
        }
    }

    /// The response, every mode's the same way.
    pub(crate) fn answer<B>(self, retry_after: Duration) -> Response<ResponseBody<B>> {
        let outcome = self.outcome();
        let body = ResponseBody::bytes;
        let mut res = match self {
            Self::Rejected(rejection) => return rejected(rejection),
            Self::Duplicate | Self::Outdated => answer(StatusCode::OK, outcome, body(Bytes::new())),
            Self::Own(res) => return (*res).map(body),
            Self::InFlight(busy) => problem_as(StatusCode::CONFLICT, outcome, busy, None, body),
            Self::Held(unfinished) => {
                problem_as(StatusCode::CONFLICT, outcome, unfinished, None, body)
            }
            Self::Draining => problem_as(
                StatusCode::SERVICE_UNAVAILABLE,
                outcome,
                "the service is shutting down; the event was not processed",
                None,
                body,
            ),
            Self::StoreUnavailable => problem_as(
                StatusCode::SERVICE_UNAVAILABLE,
                outcome,
                "the idempotency store is unavailable; the event was not processed",
                None,
                body,
            ),
        };
        if matches!(
            outcome,
            Outcome::InFlight | Outcome::Draining | Outcome::StoreUnavailable
        ) {
            set_retry_after(&mut res, retry_after);
        }
        res
    }
}

/// The outcome a mode's own answer names.
fn own(res: &Response<Bytes>) -> Outcome {
    res.extensions()
        .get::<Outcome>()
        .copied()
        .unwrap_or(Outcome::Rejected)
}

/// A 4xx before any claim, logged as the layer always did, with its error in the extensions.
fn rejected<B>(rejection: Rejection) -> Response<ResponseBody<B>> {
    let (mut res, timed_out) = match rejection {
        Rejection::Key(error) => {
            tracing::debug!(outcome = Outcome::Rejected.as_str(), %error, "delivery rejected");
            return key_problem(error, Outcome::Rejected);
        }
        #[cfg(feature = "verify")]
        Rejection::Signature(error) => {
            tracing::warn!(
                outcome = Outcome::Unverified.as_str(),
                %error,
                "delivery refused: its signature did not verify; nothing was claimed",
            );
            let expected = match &error {
                crate::verify::VerifyError::Missing { expected } => Some(&**expected),
                _ => None,
            };
            let detail = error.to_string();
            let mut res = crate::response::problem(
                StatusCode::UNAUTHORIZED,
                Outcome::Unverified,
                &detail,
                expected,
            );
            res.extensions_mut().insert(error);
            (res, false)
        }
        Rejection::Own(res) => {
            let timed_out = res.status() == StatusCode::REQUEST_TIMEOUT;
            (*res, timed_out)
        }
    };
    if timed_out {
        // The rest of the body may still be on its way: the connection cannot be reused.
        res.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    res.map(ResponseBody::bytes)
}

/// The 4xx of a key error, naming `outcome`, with the error in the extensions: the request
/// cannot be used (before any claim), or its body did not arrive (after).
pub(crate) fn key_problem<B>(error: KeyError, outcome: Outcome) -> Response<ResponseBody<B>> {
    let expected = match &error {
        KeyError::Missing { expected } => Some(&**expected),
        _ => None,
    };
    let detail = error.to_string();
    let mut res = problem_as(
        error.status(),
        outcome,
        &detail,
        expected,
        ResponseBody::bytes,
    );
    if error == KeyError::BodyTimeout {
        // The rest of the body may still be on its way: the connection cannot be reused.
        res.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    res.extensions_mut().insert(error);
    res
}
