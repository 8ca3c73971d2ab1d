//! Before the claim: the delivery's key, the body buffered only when it must be, and the
//! answers that need no store.

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_service::Service;

use super::settings::{MissingKey, Settings};
use crate::body::{RequestBody, ResponseBody};
use crate::key::{ExtractKey, IdempotencyKey, KeyError};
use crate::response::{self, Outcome};

pub(crate) use crate::body::BoxError;

/// What the key of a delivery decided, with what to pass on: the request ([`keyed`]), or its
/// body ([`key_of`]).
pub(crate) enum Keyed<T> {
    /// A valid key, and the request (or body) to pass on.
    Key(IdempotencyKey, T),
    /// No key, and the layer lets such requests through unguarded.
    PassThrough(T),
    /// An answer of 4xx.
    Rejected(Rejection),
}

/// Why a delivery is answered 4xx before any claim.
pub(crate) enum Rejection {
    /// No usable key, or an unreadable body.
    Key(KeyError),
    /// A missing, malformed, wrong or expired signature: 401.
    #[cfg(feature = "verify")]
    Signature(crate::verify::VerifyError),
}

impl From<KeyError> for Rejection {
    fn from(error: KeyError) -> Self {
        Self::Key(error)
    }
}

/// Finds the delivery's key (buffering the body if the extractor reads it, if the signature
/// is verified, or always when `buffer_always`), verifies the signature, joins the scope, and
/// decides what happens to a delivery without a key. (Transactional mode's; claim-then-commit
/// keeps the head itself and calls [`key_of`].)
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) async fn keyed<K, B>(
    extractor: &K,
    settings: &Settings,
    buffer_always: bool,
    req: Request<B>,
) -> Keyed<Request<RequestBody<B>>>
where
    K: ExtractKey,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    match key_of(extractor, settings, buffer_always, &parts, body).await {
        Keyed::Key(key, body) => Keyed::Key(key, Request::from_parts(parts, body)),
        Keyed::PassThrough(body) => Keyed::PassThrough(Request::from_parts(parts, body)),
        Keyed::Rejected(rejection) => Keyed::Rejected(rejection),
    }
}

/// [`keyed`] for a request already split, which leaves the head with its caller: a delivery
/// that keeps the head in its own future, until it passes the request on, holds it once.
pub(crate) async fn key_of<K, B>(
    extractor: &K,
    settings: &Settings,
    buffer_always: bool,
    parts: &Parts,
    body: B,
) -> Keyed<RequestBody<B>>
where
    K: ExtractKey,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let reads = extractor.reads_body(parts);
    let needed = reads || buffer_always || verifies(settings);
    let (bytes, body) = match take_body(needed, parts, body, settings).await {
        Ok(taken) => taken,
        Err(error) => return Keyed::Rejected(error.into()),
    };
    if let Err(refused) = verified(settings, parts, bytes.as_deref()) {
        return Keyed::Rejected(refused);
    }
    let key = extractor.extract(parts, bytes.as_deref().filter(|_| reads));
    match check_len(key, settings).and_then(|key| settings.scope.apply(key, parts)) {
        Ok(key) => {
            super::observe::keyed(&key);
            Keyed::Key(key, body)
        }
        Err(KeyError::Missing { .. }) if settings.missing_key == MissingKey::PassThrough => {
            Keyed::PassThrough(body)
        }
        Err(error) => Keyed::Rejected(error.into()),
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

pub(crate) fn reject<B>(rejection: &Rejection) -> Response<ResponseBody<B>> {
    match rejection {
        Rejection::Key(error) => {
            tracing::debug!(outcome = Outcome::Rejected.as_str(), %error, "delivery rejected");
            response::rejected(error)
        }
        #[cfg(feature = "verify")]
        Rejection::Signature(error) => {
            tracing::warn!(
                outcome = Outcome::Unverified.as_str(),
                %error,
                "delivery refused: its signature did not verify; nothing was claimed",
            );
            response::unverified(error)
        }
    }
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

/// The one event every delivery with a key records.
pub(crate) fn record(key: &IdempotencyKey, outcome: Outcome) {
    tracing::debug!(
        namespace = key.namespace(),
        key = key.value(),
        outcome = outcome.as_str(),
        "delivery",
    );
}
