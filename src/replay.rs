//! Response replay and request fingerprints, for API idempotency keys.
//!
//! A webhook sender needs only the 200. A client that sends `Idempotency-Key` to an API (a
//! payment, an order) needs the answer its first request got: an empty 200 tells it nothing
//! about the charge it retried. [`IdempotencyLayer::for_api`](crate::IdempotencyLayer::for_api)
//! turns on what such clients expect, after the IETF `Idempotency-Key` draft
//! (draft-ietf-httpapi-idempotency-key-header):
//!
//! ```
//! use axum::{Json, Router, http::StatusCode, routing::post};
//! use http::Request;
//! use http_body_util::BodyExt;
//! use tower::ServiceExt;
//! use tower_idempotency::{IdempotencyLayer, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let charge = || async { (StatusCode::CREATED, Json(serde_json::json!({"id": "pay_1"}))) };
//! let app = Router::new()
//!     .route("/payments", post(charge).layer(IdempotencyLayer::for_api(MemoryStore::new())));
//! let pay = |body: &'static str| {
//!     Request::post("/payments")
//!         .header("idempotency-key", "\"8e03978e\"")
//!         .header("content-type", "application/json")
//!         .body(axum::body::Body::from(body))
//!         .unwrap()
//! };
//!
//! let first = app.clone().oneshot(pay(r#"{"amount":100}"#)).await.unwrap();
//! assert_eq!(first.status(), StatusCode::CREATED);
//!
//! // The retry gets the same answer, byte for byte, marked as a replay.
//! let again = app.clone().oneshot(pay(r#"{"amount":100}"#)).await.unwrap();
//! assert_eq!(again.status(), StatusCode::CREATED);
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! assert_eq!(again.headers()["content-type"], "application/json");
//! let body = again.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(body, r#"{"id":"pay_1"}"#);
//!
//! // The same key for another request: 422, and the handler does not run.
//! let reused = app.oneshot(pay(r#"{"amount":999}"#)).await.unwrap();
//! assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
//! # }
//! ```
//!
//! # What is stored, and what is not
//!
//! [`Replay`] stores, when the layer commits, the status, the headers of an allowlist
//! (`content-type`, `location`, `etag` and the like; [`Replay::header`] adds more) and the
//! body, up to [`Replay::body_limit`] (default 256 KiB). A duplicate of the key gets that
//! answer back with [`REPLAYED_HEADER`] (`Idempotent-Replayed: true`).
//!
//! - `Set-Cookie`, `Authorization`, `Proxy-Authorization`, `WWW-Authenticate`,
//!   `Proxy-Authenticate` and the connection's own headers (`Connection`, `Transfer-Encoding`,
//!   `Content-Length` and the like) are never stored, whatever the allowlist says: a replay
//!   must not hand one client's session to whoever holds its key.
//! - A body is stored only when its length is known and within the limit (axum's `Json`,
//!   `String` and `Bytes` answers know theirs). A longer one, or a stream of unknown length,
//!   is passed through as it comes, never buffered: the key is committed without it, and its
//!   duplicates get the plain 200 of a webhook duplicate.
//! - 5xx and 429 answers are never stored. [`for_api`](crate::IdempotencyLayer::for_api)
//!   releases the claim on them and on the 4xx that ask for the same request again (408, 409,
//!   423, 425) or for other credentials or headers (401, 403, 415), so the client's retry
//!   runs; it commits, and so stores and replays, every other answer, the other 4xx included
//!   (a declined card stays declined).
//! - An answer whose `Vary` names a request header the fingerprint leaves out (`Vary:
//!   Accept-Encoding` from a compression layer further in, say), or `Vary: *`, is not stored:
//!   another request with the key might need another answer. Name the header in the
//!   fingerprint ([`RequestFingerprint::header`]) to store such answers.
//! - Should the body fail while it is read to be stored (an error, a panic, or past the
//!   layer's [`body_timeout`](crate::IdempotencyLayer::body_timeout)), the handler's work
//!   stands: the key commits without the answer, the client gets 500, and its retry the
//!   plain 200.
//! - Trailers are not kept.
//! - A stored answer lives as long as its key: until
//!   [`purge_completed`](crate::store::Store::purge_completed) deletes it, after the
//!   retention the application chose ([`DEFAULT_RETENTION`](crate::store::DEFAULT_RETENTION),
//!   7 days, by default). A retry after that runs again.
//!
//! # Fingerprints
//!
//! [`RequestFingerprint`] digests the method, the path with its query, the body and the
//! headers chosen with [`RequestFingerprint::header`] (SHA-256). The commit keeps the digest;
//! a later request with the key and another digest is answered **422** problem+json
//! ([`Outcome::KeyReused`]) and does not run. The body is read
//! whole for it, within the layer's [`body_limit`](crate::IdempotencyLayer::body_limit) (413
//! past it). A request that meets the key while its first request still runs gets the 409
//! of any delivery in flight, whatever its fingerprint.
//!
//! # Keys from clients
//!
//! [`key::idempotency_key`](crate::key::idempotency_key) reads `Idempotency-Key` as an RFC
//! 8941 String (`"abc"`), and also takes the bare text clients often send (`abc`) as it is:
//! the two are the same key. A quoted value with parameters (`"abc";a=1`) is refused with 400,
//! and so is one whose text breaks the key rules (empty, longer than 255 bytes, or with
//! spaces at either end: `" abc"`).
//!
//! Clients choose their keys, so two clients can choose the same one. Scope keys by client
//! where the application knows who the client is, e.g. from what an authentication layer
//! further out put in the request extensions:
//!
//! ```
//! use tower_idempotency::{IdempotencyLayer, key::Scope, store::MemoryStore};
//!
//! /// Put in the request extensions by the application's authentication layer.
//! #[derive(Clone)]
//! struct Principal(String);
//!
//! // Keys stored as `idempotency-key@client=<principal>/<path>`: one client cannot meet
//! // another's keys, nor its own on another route.
//! let layer = IdempotencyLayer::for_api(MemoryStore::new()).scope(Scope::from_fn(|parts| {
//!     match parts.extensions.get::<Principal>() {
//!         Some(who) => format!("client={}{}", who.0, parts.uri.path()),
//!         None => String::new(),
//!     }
//! }));
//! # let _ = layer;
//! ```
//!
//! An empty scope is refused with 400: here, a request that reached the layer without a
//! principal.
//!
//! Replay is for the claim-then-commit layer; the transactional mode and the version guard
//! store no answers.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::request::Parts;
use http::{HeaderName, Response, StatusCode, header};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use sha2::{Digest, Sha256};

use crate::body::{BoxError, ResponseBody};
use crate::engine::run::Keep;
use crate::response::{self, Outcome};
use crate::store::{Fingerprint, StoredResponse};

/// The header that marks a replayed answer: `Idempotent-Replayed: true`.
pub const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The default limit on a stored body: 256 KiB.
pub const DEFAULT_REPLAY_LIMIT: usize = 256 * 1024;

/// The headers a [`Replay`] stores unless told otherwise.
const KEPT: [HeaderName; 12] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_DISPOSITION,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    header::CACHE_CONTROL,
    header::EXPIRES,
    header::LINK,
    header::VARY,
];

/// Headers never stored, whatever the allowlist says: credentials, and the connection's own.
const NEVER: [HeaderName; 13] = [
    header::SET_COOKIE,
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::WWW_AUTHENTICATE,
    header::PROXY_AUTHENTICATE,
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::CONTENT_LENGTH,
    REPLAYED_HEADER,
    crate::response::OUTCOME_HEADER,
];

/// What a layer stores of a committed answer, to replay it to the key's duplicates. Set with
/// [`IdempotencyLayer::replay`](crate::IdempotencyLayer::replay); see the [module
/// docs](self).
#[derive(Clone)]
pub struct Replay {
    limit: usize,
    headers: Vec<HeaderName>,
}

impl Replay {
    /// Stores the status, the allowlisted headers (`content-type`, `content-encoding`,
    /// `content-disposition`, `content-language`, `content-location`, `location`, `etag`,
    /// `last-modified`, `cache-control`, `expires`, `link`, `vary`) and bodies up to
    /// [`DEFAULT_REPLAY_LIMIT`]. The body is stored as the handler sent it, so a compressed one
    /// is replayed with its `content-encoding`.
    pub fn new() -> Self {
        Self {
            limit: DEFAULT_REPLAY_LIMIT,
            headers: KEPT.to_vec(),
        }
    }

    /// Stores bodies up to `bytes` long; longer ones pass through unstored.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.limit = bytes;
        self
    }

    /// Stores the header `name` too. `Set-Cookie`, the credentials headers and the
    /// connection's own headers are never stored, even when named here.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn header<N>(mut self, name: N) -> Self
    where
        N: TryInto<HeaderName>,
        N::Error: fmt::Debug,
    {
        let name = name
            .try_into()
            .unwrap_or_else(|err| panic!("invalid header name: {err:?}"));
        if !self.headers.contains(&name) {
            self.headers.push(name);
        }
        self
    }

    fn keeps(&self, name: &HeaderName) -> bool {
        self.headers.contains(name) && !NEVER.contains(name)
    }
}

impl Default for Replay {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("body_limit", &self.limit)
            .field("headers", &self.headers)
            .finish()
    }
}

/// What identifies a request beyond its key: the method, the path with its query, the body,
/// and any headers named. Set with
/// [`IdempotencyLayer::fingerprint`](crate::IdempotencyLayer::fingerprint); see the [module
/// docs](self).
#[derive(Debug, Clone)]
pub struct RequestFingerprint {
    body: bool,
    headers: Vec<HeaderName>,
}

impl RequestFingerprint {
    /// The method, the path and query, and the body.
    pub fn new() -> Self {
        Self {
            body: true,
            headers: Vec::new(),
        }
    }

    /// The header `name` too (its values in order; an absent header counts as absent).
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn header<N>(mut self, name: N) -> Self
    where
        N: TryInto<HeaderName>,
        N::Error: fmt::Debug,
    {
        let name = name
            .try_into()
            .unwrap_or_else(|err| panic!("invalid header name: {err:?}"));
        self.headers.push(name);
        self
    }

    /// Leaves the body out, so that it is not buffered: for uploads too large to hold, where
    /// the path and headers tell requests apart.
    pub fn without_body(mut self) -> Self {
        self.body = false;
        self
    }

    /// Whether the body is part of the fingerprint, and so must be buffered.
    pub(crate) fn reads_body(&self) -> bool {
        self.body
    }

    /// The request's fingerprint: each part length-prefixed, so that no two requests share
    /// one by moving bytes from one part to the next.
    pub(crate) fn of(&self, parts: &Parts, body: Option<&[u8]>) -> Fingerprint {
        let mut digest = Sha256::new();
        let mut part = |bytes: &[u8]| {
            digest.update((bytes.len() as u64).to_be_bytes());
            digest.update(bytes);
        };
        part(b"tower-idempotency fingerprint 1");
        part(parts.method.as_str().as_bytes());
        let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        part(target.as_bytes());
        for name in &self.headers {
            part(name.as_str().as_bytes());
            let values = parts.headers.get_all(name);
            let count = values.iter().count() as u64;
            part(&count.to_be_bytes());
            for value in values {
                part(value.as_bytes());
            }
        }
        if self.body {
            part(body.unwrap_or_default());
        }
        Fingerprint::from_bytes(digest.finalize().into())
    }
}

impl Default for RequestFingerprint {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether a header is one of those never replayed, whatever a receipt holds.
pub(crate) fn never_replayed(name: &HeaderName) -> bool {
    NEVER.contains(name)
}

/// Stores what a [`Replay`] says, for a layer that has one. One pointer: it is held through
/// the handler's run, whose future is boxed for every delivery.
pub(crate) struct Keeper(pub(crate) Arc<Capture>);

/// What a layer with replay stores, and how.
#[derive(Debug)]
pub(crate) struct Capture {
    pub(crate) replay: Arc<Replay>,
    /// The fingerprint's headers: an answer that varies on others is not stored.
    pub(crate) fingerprint: Option<Arc<RequestFingerprint>>,
    /// How long the body may take to be read.
    pub(crate) timeout: Duration,
}

impl<B> Keep<B> for Keeper
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    fn stores(&self) -> bool {
        true
    }

    async fn keep(self, res: Response<B>) -> (Response<ResponseBody<B>>, Option<StoredResponse>) {
        // Boxed: the run's future does not carry the reading unless the layer replays.
        Box::pin(capture(self.0, res)).await
    }
}

/// Reads the answer whole and stores it, when it may be stored: not 5xx or 429, of known
/// length within the limit, and varying on no header the fingerprint leaves out.
async fn capture<B>(
    how: Arc<Capture>,
    res: Response<B>,
) -> (Response<ResponseBody<B>>, Option<StoredResponse>)
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (replay, fingerprint, timeout) = (&how.replay, how.fingerprint.as_deref(), how.timeout);
    let status = res.status();
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        return (res.map(ResponseBody::new), None);
    }
    let length = res.body().size_hint().exact();
    if length.is_none_or(|len| len > replay.limit as u64) {
        tracing::debug!(
            ?length,
            limit = replay.limit,
            "answer passed through unstored: longer than the replay limit, or of unknown \
             length; its duplicates get the plain 200"
        );
        return (res.map(ResponseBody::new), None);
    }
    if let Some(header) = varies_beyond(res.headers(), fingerprint) {
        tracing::debug!(
            vary = header,
            "answer passed through unstored: it varies on a request header the fingerprint \
             leaves out, so another request with the key may need another answer"
        );
        return (res.map(ResponseBody::new), None);
    }
    let (parts, body) = res.into_parts();
    let read = AssertUnwindSafe(Limited::new(body, replay.limit).collect()).catch_unwind();
    let failed = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(Ok(collected))) => {
            let bytes = collected.to_bytes();
            let headers = parts
                .headers
                .iter()
                .filter(|(name, _)| replay.keeps(name))
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect();
            let stored = StoredResponse::new(status, headers, bytes.clone());
            return (
                Response::from_parts(parts, ResponseBody::bytes(bytes)),
                Some(stored),
            );
        }
        Ok(Ok(Err(error))) => error.to_string(),
        Ok(Err(_panic)) => "the body panicked".to_owned(),
        Err(_elapsed) => format!("the body did not arrive within {timeout:?}"),
    };
    // The handler succeeded: its work is done and the key commits, without the answer.
    tracing::error!(
        error = failed,
        "the handler's answer failed while it was read to be stored; the key commits without \
         it, and the client gets 500"
    );
    (unreadable_answer(), None)
}

/// The handler succeeded, but its answer failed while it was read to be stored: 500, the key
/// committed without it.
fn unreadable_answer<B>() -> Response<ResponseBody<B>> {
    response::problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        Outcome::Processed,
        "the request was processed, but its answer failed while it was read and is lost; a \
         retry with the same key is answered 200 without a body",
        None,
    )
    .map(ResponseBody::bytes)
}

/// A duplicate answered with the stored answer of the delivery that committed its key.
pub(crate) fn replayed(stored: &StoredResponse) -> Response<Bytes> {
    let mut res = response::answer(stored.status, Outcome::Replayed, stored.body.clone());
    for (name, value) in &stored.headers {
        // The store kept only allowed headers; a receipt written by other code may not have.
        if !never_replayed(name) {
            res.headers_mut().append(name.clone(), value.clone());
        }
    }
    res.headers_mut()
        .insert(REPLAYED_HEADER, http::HeaderValue::from_static("true"));
    res
}

/// A key used before for a request with another fingerprint: 422, as the `Idempotency-Key`
/// draft asks.
pub(crate) fn key_reused() -> Response<Bytes> {
    response::problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        Outcome::KeyReused,
        "this idempotency key was used before for a different request (method, path or body); \
         a new request needs a new key",
        None,
    )
}

/// The first header named in the answer's `Vary` that the fingerprint does not cover, if
/// any (`*` covers everything, so no fingerprint does).
fn varies_beyond<'h>(
    headers: &'h http::HeaderMap,
    fingerprint: Option<&RequestFingerprint>,
) -> Option<&'h str> {
    let covered = fingerprint.map_or(&[][..], |f| &f.headers[..]);
    headers
        .get_all(header::VARY)
        .iter()
        .flat_map(|value| value.to_str().unwrap_or("*").split(','))
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .find(|name| {
            *name == "*"
                || !covered
                    .iter()
                    .any(|c| c.as_str().eq_ignore_ascii_case(name))
        })
}
