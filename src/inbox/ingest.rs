//! Ingest: the layer that stores a route's deliveries in the inbox and answers at once.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use super::Inbox;
use crate::body::{RequestBody, ResponseBody};
use crate::engine::Guarded;
use crate::engine::drain::Entry;
use crate::engine::handback::{HandBack, HandedBack, Reach};
use crate::engine::mode::Mode;
use crate::engine::observe::record;
use crate::engine::prepare::{find_key, verifies};
use crate::engine::refusal::{Refusal, Rejection};
use crate::engine::run::Ran;
use crate::engine::settings::{Settings, shared_settings};
use crate::key::{self, Auto, ExtractKey, IdempotencyKey};
use crate::response::{Outcome, answer};
use crate::store::inbox::{Enqueued, InboxStore, StoredRequest};

/// The headers an inbox does not keep by default: hop-by-hop fields, which belong to one
/// connection, and credentials.
const DROPPED: [HeaderName; 10] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::AUTHORIZATION,
    header::COOKIE,
];

/// Stores each delivery of the routes it wraps in an [`Inbox`] and answers 202 once the write
/// is durable; the inbox's [`Workers`](super::Workers) run the wrapped service later. Made by
/// [`Inbox::layer`].
///
/// Configured like [`IdempotencyLayer`](crate::IdempotencyLayer): the key, the scope,
/// `verify`, the body limit (the largest delivery kept: larger ones get 413), the drain.
///
/// # Verification is not optional
///
/// An inbox layer checks each delivery's signature (`.verify(..)`, feature `verify`), or is
/// told in so many words that it does not ([`unverified`](Self::unverified)): building the
/// layer panics otherwise. The inbox stores the first copy of an event and answers every
/// later copy "duplicate". Inline, a forged delivery sent first with a real event id only
/// delays the genuine one (the forgery's handler fails, its claim is released, and the
/// sender's retry runs); in the inbox the forgery would be the copy that is kept, and the
/// genuine event would be lost. Call `unverified()` for a route whose deliveries were checked
/// already (behind a gateway that verifies), or whose sender signs nothing and is reached only
/// from a network you trust.
///
/// ```
/// # #[cfg(feature = "memory")] {
/// use http::StatusCode;
/// use tower_idempotency::{inbox::Inbox, key, store::MemoryStore};
///
/// let inbox = Inbox::new(MemoryStore::new());
/// let layer = inbox
///     .layer()
///     .key(key::shopify())
///     .unverified() // the gateway in front checked the HMAC
///     .body_limit(256 * 1024)
///     .accepted_status(StatusCode::OK) // for a sender that wants 200
///     .keep_header("authorization");
/// # let _ = layer;
/// # }
/// ```
#[must_use]
pub struct InboxLayer<St, K = Auto> {
    inbox: Inbox<St>,
    key: K,
    settings: Settings,
    ingest: IngestSettings,
}

#[derive(Debug, Clone)]
struct IngestSettings {
    accepted: StatusCode,
    dropped: Vec<HeaderName>,
    /// Stores deliveries without checking a signature: said explicitly.
    unverified: bool,
}

impl<St: InboxStore + Clone> InboxLayer<St> {
    pub(super) fn new(inbox: Inbox<St>) -> Self {
        Self {
            inbox,
            key: key::auto(),
            settings: Settings::default(),
            ingest: IngestSettings {
                accepted: StatusCode::ACCEPTED,
                dropped: DROPPED.to_vec(),
                unverified: false,
            },
        }
    }
}

impl<St, K> InboxLayer<St, K> {
    shared_settings!();

    /// Finds keys with `key` instead, e.g. [`key::stripe()`] or
    /// [`key::header("x-event-id")`](key::header).
    pub fn key<K2: ExtractKey>(self, key: K2) -> InboxLayer<St, K2> {
        InboxLayer {
            inbox: self.inbox,
            key,
            settings: self.settings,
            ingest: self.ingest,
        }
    }

    /// Stores deliveries without checking their signature: for a route behind a gateway that
    /// verified them already, or a sender that signs nothing. Without it (or `.verify(..)`),
    /// building the layer panics; see [why](Self#verification-is-not-optional).
    pub fn unverified(mut self) -> Self {
        self.ingest.unverified = true;
        self
    }

    /// The status a stored delivery is answered with. Default: 202 Accepted.
    ///
    /// # Panics
    ///
    /// If `status` is not a 2xx: a sender must take the answer for success.
    #[track_caller]
    pub fn accepted_status(mut self, status: StatusCode) -> Self {
        assert!(
            status.is_success(),
            "accepted_status({status}) is not a success"
        );
        self.ingest.accepted = status;
        self
    }

    /// Keeps header `name` with the stored request although it is dropped by default
    /// (`authorization`, say, for a handler that reads it).
    pub fn keep_header(mut self, name: impl AsRef<str>) -> Self {
        let name = name.as_ref();
        self.ingest
            .dropped
            .retain(|dropped| !dropped.as_str().eq_ignore_ascii_case(name));
        self
    }

    /// Drops header `name` from the stored request (a secret of your own, say).
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    #[track_caller]
    pub fn drop_header(mut self, name: impl AsRef<str>) -> Self {
        let name = HeaderName::from_bytes(name.as_ref().as_bytes()).expect("a header name");
        self.ingest.dropped.push(name);
        self
    }
}

impl<St: Clone, K: Clone> Clone for InboxLayer<St, K> {
    fn clone(&self) -> Self {
        Self {
            inbox: self.inbox.clone(),
            key: self.key.clone(),
            settings: self.settings.clone(),
            ingest: self.ingest.clone(),
        }
    }
}

impl<St: fmt::Debug, K: fmt::Debug> fmt::Debug for InboxLayer<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxLayer")
            .field("inbox", &self.inbox)
            .field("key", &self.key)
            .field("settings", &self.settings)
            .field("ingest", &self.ingest)
            .finish()
    }
}

/// The service of an [`InboxLayer`].
pub type InboxService<S, St, K = Auto> = Guarded<S, Ingest<St, K>>;

impl<S, St, K> Layer<S> for InboxLayer<St, K>
where
    St: InboxStore + Clone,
    K: ExtractKey + Clone,
{
    type Service = InboxService<S, St, K>;

    /// # Panics
    ///
    /// If the layer neither verifies signatures (`.verify(..)`) nor was told
    /// [`unverified`](InboxLayer::unverified): see [why](InboxLayer#verification-is-not-optional).
    #[track_caller]
    fn layer(&self, inner: S) -> Self::Service {
        assert!(
            self.ingest.unverified || verifies(&self.settings),
            "an inbox layer must check signatures, `.verify(..)`, or be told `.unverified()`: \
             without a check, a forged delivery sent first is the copy the inbox keeps, and the \
             genuine event is answered as its duplicate"
        );
        Guarded::new(
            inner,
            Arc::new(Ingest {
                inbox: self.inbox.clone(),
                key: self.key.clone(),
                settings: self.settings.clone(),
                ingest: self.ingest.clone(),
            }),
        )
    }
}

/// Inbox mode's ingest: a delivery's claim is the write that stores it.
pub struct Ingest<St, K = Auto> {
    inbox: Inbox<St>,
    key: K,
    settings: Settings,
    ingest: IngestSettings,
}

impl<St: fmt::Debug, K: fmt::Debug> fmt::Debug for Ingest<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ingest")
            .field("inbox", &self.inbox)
            .field("key", &self.key)
            .finish()
    }
}

pub(crate) struct Found {
    key: IdempotencyKey,
    /// Shared with the claim's future: the headers are not copied again.
    request: Arc<StoredRequest>,
}

/// The URI the app received: before a `Router::nest` (or `nest_service`) took its prefix off,
/// as axum records it; the request's own URI without a router that records one.
fn received_uri(parts: &Parts) -> &http::Uri {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::OriginalUri(uri)) = parts.extensions.get() {
        return uri;
    }
    &parts.uri
}

impl<St, K> Ingest<St, K> {
    /// The request as the inbox keeps it.
    fn stored(&self, parts: &Parts, body: Bytes) -> StoredRequest {
        let uri = received_uri(parts);
        let uri = uri
            .path_and_query()
            .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned());
        let headers = parts
            .headers
            .iter()
            .filter(|(name, _)| !self.ingest.dropped.contains(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        StoredRequest::new(parts.method.clone(), uri, headers, body)
    }
}

impl<S, St, K, B, ResB> Mode<S, B, ResB> for Ingest<St, K>
where
    S: Service<Request<RequestBody<B>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: fmt::Display + Send + 'static,
    St: InboxStore + Clone,
    K: ExtractKey,
    B: Body + Send + 'static,
    ResB: Send + 'static,
{
    type Found = Found;
    /// The delivery stays counted in the drain until it is answered.
    type Held = Entry;

    fn settings(&self) -> &Settings {
        &self.settings
    }

    /// A worker's request reached its route: the handler runs, detached, and its answer goes
    /// back to the worker.
    fn handed_back(&self, hand_back: &HandBack) -> HandedBack {
        match hand_back.reach() {
            Reach::Run(reporter) => HandedBack::Run(reporter),
            // An inbox layer inside another's route: the outer one runs it.
            Reach::Reached => HandedBack::PassThrough,
            Reach::Closed => HandedBack::Refuse,
        }
    }

    fn describe_error(error: &S::Error) -> String {
        error.to_string()
    }

    fn reads_body(&self, _parts: &Parts) -> bool {
        true
    }

    fn find(&self, parts: &Parts, body: Option<&Bytes>) -> Result<Option<Found>, Rejection> {
        let Some(key) = find_key(&self.key, &self.settings, parts, body)? else {
            return Ok(None);
        };
        let body = body.cloned().unwrap_or_default();
        Ok(Some(Found {
            key,
            request: Arc::new(self.stored(parts, body)),
        }))
    }

    #[allow(
        clippy::manual_async_fn,
        reason = "the trait names the future's bounds"
    )]
    fn claim(
        self: Arc<Self>,
        found: &Found,
        entry: Entry,
    ) -> impl Future<Output = Result<Entry, Refusal>> + Send {
        let key = found.key.clone();
        let request = found.request.clone();
        async move {
            let store = self.inbox.store();
            let started = crate::engine::observe::started();
            let stored =
                tokio::time::timeout(self.settings.store_timeout, store.enqueue(&key, &request))
                    .await;
            if let Some(started) = started {
                crate::metrics::store_call("enqueue", started.elapsed());
            }
            match stored {
                Ok(Ok(Enqueued::Stored)) => {
                    self.inbox.wake().notify_waiters();
                    Ok(entry)
                }
                Ok(Ok(Enqueued::Duplicate(state))) => {
                    tracing::trace!(state = state.as_str(), "duplicate of an inbox entry");
                    Err(Refusal::Duplicate)
                }
                Ok(Err(error)) => {
                    tracing::error!(
                        namespace = key.namespace(),
                        key = key.value(),
                        error = &error as &dyn std::error::Error,
                        "the inbox could not store a delivery; answered 503",
                    );
                    Err(Refusal::StoreUnavailable)
                }
                Err(_) => {
                    tracing::error!(
                        namespace = key.namespace(),
                        key = key.value(),
                        "the inbox did not answer within the store timeout; answered 503 (the \
                         write may still land: the sender's retry then finds a duplicate)",
                    );
                    Err(Refusal::StoreUnavailable)
                }
            }
        }
    }

    fn run(
        self: Arc<Self>,
        held: Entry,
        _inner: S,
        _request: Request<RequestBody<B>>,
    ) -> impl Future<Output = Ran<Response<ResponseBody<ResB>>, S::Error>> + Send + 'static {
        drop(held);
        let res = answer(
            self.ingest.accepted,
            Outcome::Queued,
            ResponseBody::bytes(Bytes::new()),
        );
        std::future::ready(Ok(Ok(res)))
    }

    fn record(&self, found: &Found, outcome: Outcome) {
        record(&found.key, outcome);
    }

    fn answered(&self, found: Found, res: &mut Response<ResponseBody<ResB>>) {
        if res.extensions().get::<Outcome>() == Some(&Outcome::Queued) {
            record(&found.key, Outcome::Queued);
        }
        res.extensions_mut().insert(found.key);
    }
}
