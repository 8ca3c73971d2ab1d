//! [`IngestLayer`]: the layer that stores a route's deliveries in the inbox and answers at
//! once, and its service, [`Ingest`].

use std::sync::Arc;

use http::StatusCode;
use http::header::{self, HeaderName};
use tower_layer::Layer;

use super::Inbox;
use super::mode::{IngestMode, IngestSettings};
use crate::engine::mode::{Guarded, Settings, shared_settings, verifies};
use crate::key::{self, Auto, ExtractKey};
use crate::store::inbox::InboxStore;

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
#[derive(Debug, Clone)]
pub struct IngestLayer<St, K = Auto> {
    inbox: Inbox<St>,
    key: K,
    settings: Settings,
    ingest: IngestSettings,
}

impl<St: InboxStore + Clone> IngestLayer<St> {
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

impl<St, K> IngestLayer<St, K> {
    shared_settings!();

    /// Finds keys with `key` instead, e.g. [`key::stripe()`] or
    /// [`key::header("x-event-id")`](key::header).
    pub fn key<K2: ExtractKey>(self, key: K2) -> IngestLayer<St, K2> {
        IngestLayer {
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

/// The service of an [`IngestLayer`]: stores each delivery in the inbox and answers at once;
/// hands a worker's request to its handler. See [`Guarded`], the service shell every mode
/// shares.
pub type Ingest<S, St, K = Auto> = Guarded<S, IngestMode<St, K>>;

impl<S, St, K> Layer<S> for IngestLayer<St, K>
where
    St: InboxStore + Clone,
    K: ExtractKey + Clone,
{
    type Service = Ingest<S, St, K>;

    /// # Panics
    ///
    /// If the layer neither verifies signatures (`.verify(..)`) nor was told
    /// [`unverified`](IngestLayer::unverified): see [why](IngestLayer#verification-is-not-optional).
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
            Arc::new(IngestMode {
                inbox: self.inbox.clone(),
                key: self.key.clone(),
                settings: self.settings.clone(),
                ingest: self.ingest.clone(),
            }),
        )
    }
}
