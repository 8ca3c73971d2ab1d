//! Before the claim: the body buffered only when it must be, the signature, the key.

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_service::Service;

use super::refusal::Rejection;
use super::settings::{MissingKey, Settings};
use crate::body::{BoxError, RequestBody, ResponseBody};
use crate::key::{ExtractKey, IdempotencyKey, KeyError};
use crate::response::{Outcome, with_outcome};

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
