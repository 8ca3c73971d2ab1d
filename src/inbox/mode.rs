//! Inbox mode's ingest, a mode of the service shell: find the key, store the delivery in one
//! durable write, answer 202; hand a worker's request to the route's handler.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::header::HeaderName;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::Body;
use tower_service::Service;

use super::Inbox;
use crate::body::{RequestBody, ResponseBody};
use crate::engine::mode::{
    Configured, HandBack, HandedBack, Mode, Ran, Reach, Refusal, Rejection, Settings, Ticket,
    acquire, find_key, record,
};
use crate::key::{Auto, ExtractKey, IdempotencyKey};
use crate::response::{Outcome, answer};
use crate::store::inbox::{Enqueued, InboxStore, StoredRequest};

/// Inbox mode's ingest as a mode of the service shell: a delivery's claim is the write that
/// stores it. What an [`Ingest`](super::Ingest) service does with each delivery, and the
/// settings it does it with. Made by [`IngestLayer`](super::IngestLayer).
#[derive(Debug)]
pub struct IngestMode<St, K = Auto> {
    pub(super) inbox: Inbox<St>,
    pub(super) key: K,
    pub(super) settings: Settings,
    pub(super) ingest: IngestSettings,
}

impl<St, K> Configured for IngestMode<St, K> {
    fn settings(&self) -> &Settings {
        &self.settings
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

impl<St, K> IngestMode<St, K> {
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

impl<S, St, K, B, ResB> Mode<S, B, ResB> for IngestMode<St, K>
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
    type Held = Ticket;

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

    async fn claim(self: Arc<Self>, found: &Found, entry: Ticket) -> Result<Ticket, Refusal> {
        let (store, key, request) = (
            self.inbox.store().clone(),
            found.key.clone(),
            found.request.clone(),
        );
        let wake = self.inbox.wake().clone();
        // Bounded like every claim: past the store timeout the write goes on in a task of its
        // own, still counted by the drain (it holds the ticket) and waking the workers if it
        // lands; the sender's retry then finds the entry.
        let storing = async move {
            let stored = store.enqueue(&key, &request).await?;
            if matches!(stored, Enqueued::Stored) {
                wake.notify_waiters();
            }
            Ok((stored, entry))
        };
        match acquire(storing, self.settings.store_timeout, "enqueue").await {
            Ok((Enqueued::Stored, entry)) => Ok(entry),
            Ok((Enqueued::Duplicate(state), _)) => {
                tracing::trace!(state = state.as_str(), "duplicate of an inbox entry");
                Err(Refusal::Duplicate)
            }
            Err(error) => {
                tracing::error!(
                    namespace = found.key.namespace(),
                    key = found.key.value(),
                    error = &error as &dyn std::error::Error,
                    "the inbox could not store a delivery; answered 503 (a write past the store \
                     timeout may still land: the sender's retry then finds the entry)",
                );
                Err(Refusal::StoreUnavailable)
            }
        }
    }

    fn run(
        self: Arc<Self>,
        held: Ticket,
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
        record(&found.key, None, None, outcome);
    }

    fn answered(&self, found: Found, res: &mut Response<ResponseBody<ResB>>) {
        if res.extensions().get::<Outcome>() == Some(&Outcome::Queued) {
            record(&found.key, None, None, Outcome::Queued);
        }
        res.extensions_mut().insert(found.key);
    }
}

/// What the ingest answers and keeps, beside the settings every mode shares.
#[derive(Debug, Clone)]
pub(super) struct IngestSettings {
    /// The status a stored delivery is answered with.
    pub(super) accepted: StatusCode,
    /// The headers left out of the stored request.
    pub(super) dropped: Vec<HeaderName>,
    /// Stores deliveries without checking a signature: said explicitly.
    pub(super) unverified: bool,
}
