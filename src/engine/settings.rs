//! The settings every mode shares, and their builder methods, written once.

use std::time::Duration;

use super::drain::Drain;
use crate::key::{MAX_KEY_LEN, Scope};
pub(crate) use crate::response::CommitWhen;

/// The default limit on a body buffered to read a key: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// What happens to a request in which the extractor finds no key at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingKey {
    /// Answer 400 with a problem+json body naming the expected key (the default).
    #[default]
    Reject,
    /// Run the inner service without a claim: no deduplication for such requests. Keys that
    /// are present but invalid are still rejected.
    PassThrough,
}

/// What every mode's builder sets the same way: bodies, answers, store bounds, the drain.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) body_limit: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) store_timeout: Duration,
    pub(crate) commit_when: CommitWhen,
    pub(crate) missing_key: MissingKey,
    pub(crate) max_key_len: usize,
    pub(crate) drain: Drain,
    pub(crate) scope: Scope,
    #[cfg(feature = "verify")]
    pub(crate) verify: Option<Verification>,
}

/// What a mode, or the owner of a lease, was configured with: written once per type, read by
/// the shell ([`Mode`](super::mode::Mode)) and by the lease guard
/// ([`Owner`](super::guard::Owner)).
pub(crate) trait Configured {
    fn settings(&self) -> &Settings;
}

/// Called when a delivery meets a stale claim that the hold policy keeps.
#[derive(Clone)]
pub(crate) struct HeldHook(pub(crate) std::sync::Arc<HeldFn>);

/// What a [`HeldHook`] calls: the key held, and how it stands.
pub(crate) type HeldFn = dyn Fn(&crate::key::IdempotencyKey, &crate::store::Pending) + Send + Sync;

impl std::fmt::Debug for HeldHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeldHook(..)")
    }
}

/// The signature check of a layer built with `.verify(..)`.
#[cfg(feature = "verify")]
#[derive(Clone)]
pub(crate) struct Verification(pub(crate) std::sync::Arc<dyn crate::verify::Verify>);

#[cfg(feature = "verify")]
impl std::fmt::Debug for Verification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verification(..)")
    }
}

impl Default for Settings {
    /// The defaults every layer documents on its `new`.
    fn default() -> Self {
        Self {
            body_limit: DEFAULT_BODY_LIMIT,
            body_timeout: Duration::from_secs(30),
            retry_after: Duration::from_secs(5),
            store_timeout: Duration::from_secs(5),
            commit_when: CommitWhen::default(),
            missing_key: MissingKey::Reject,
            max_key_len: MAX_KEY_LEN,
            drain: Drain::new(),
            scope: Scope::default(),
            #[cfg(feature = "verify")]
            verify: None,
        }
    }
}

/// The builder methods of the shared [`Settings`], for a layer with a `settings` field. One
/// definition, so the three layers cannot drift apart in names or meaning. A layer that
/// journals names the field whose `journal` [`SharedSettings`](super::shared::SharedSettings) sets:
/// `shared_settings!(journal: claims)`.
macro_rules! shared_settings {
    ($(journal: $journaled:ident)?) => {
        /// Applies settings shared with other layers: each setting `shared` holds is set as
        /// if this layer's method of the same name were called here, and the others keep
        /// their values. A later call on this layer overrides one, for this layer alone. See
        /// [`SharedSettings`](crate::SharedSettings).
        pub fn with(mut self, shared: &$crate::engine::SharedSettings) -> Self {
            shared.apply(&mut self.settings);
            $(
                if let Some(journal) = shared.journal_given() {
                    self.$journaled.journal = Some(journal.clone());
                }
            )?
            self
        }

        /// The largest body buffered to read a key, in bytes; larger bodies get 413. Only body
        /// extractors buffer (and transactional mode, which reads every body before it
        /// begins). Default: 1 MiB.
        pub fn body_limit(mut self, bytes: usize) -> Self {
            self.settings.body_limit = bytes;
            self
        }

        /// How long a body may take to arrive. Default: 30 seconds; `Duration::MAX` for no
        /// limit.
        ///
        /// A body the layer buffers (body keys, `verify`, transactional mode) must arrive whole
        /// within it, or the delivery gets 408 and nothing is claimed. A body passed on to the
        /// handler of a claimed delivery (header keys) may keep the handler waiting that long
        /// in all; past it, reading the body fails with
        /// [`BodyTimeoutError`](crate::body::BodyTimeoutError) and the claim is released
        /// whatever the handler answers (a success becomes 408), so a body that trickles or
        /// never comes cannot hold a key.
        pub fn body_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.settings.body_timeout = timeout;
            self
        }

        /// The `Retry-After` sent with the in-flight 409 and with 503 (store failure,
        /// draining). Default: 5 seconds. A held claim's 409 has none: only a person can
        /// settle it.
        pub fn retry_after(mut self, after: ::std::time::Duration) -> Self {
            self.settings.retry_after = after;
            self
        }

        /// How long one store call (claim, renewal, commit, release) may take. A claim past
        /// it is answered 503 (and given back when it lands later); a commit or release past
        /// it is retried in the background. Default: 5 seconds.
        pub fn store_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.settings.store_timeout = timeout;
            self
        }

        /// Which inner responses count as success and commit; the others release. Default:
        /// 2xx. Any `Fn(StatusCode) -> bool` will do, a closure that captures what it needs
        /// included.
        ///
        /// ```
        /// use http::StatusCode;
        /// use tower_idempotency::{IdempotencyLayer, store::MemoryStore};
        ///
        /// // This sender treats 2xx and 3xx as delivered.
        /// let layer = IdempotencyLayer::new(MemoryStore::new())
        ///     .commit_when(|status| status.is_success() || status.is_redirection());
        ///
        /// // A 409 of our own means "already applied": keep the event done.
        /// let done_anyway = [StatusCode::CONFLICT];
        /// let layer = layer.commit_when(move |status| status.is_success() || done_anyway.contains(&status));
        /// # let _ = layer;
        /// ```
        pub fn commit_when<F>(mut self, predicate: F) -> Self
        where
            F: Fn(::http::StatusCode) -> bool + Send + Sync + 'static,
        {
            self.settings.commit_when =
                $crate::engine::settings::CommitWhen(::std::sync::Arc::new(predicate));
            self
        }

        /// What to do with requests that carry no key (for the version guard: no entity id or
        /// no version). Default: [`MissingKey::Reject`](crate::MissingKey::Reject).
        pub fn missing_key(mut self, policy: $crate::engine::MissingKey) -> Self {
            self.settings.missing_key = policy;
            self
        }

        /// Rejects key values (entity ids) longer than `bytes` with 400. Default and maximum:
        /// [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN) (255), the longest key every store keeps.
        ///
        /// # Panics
        ///
        /// If `bytes` is above [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN): a configuration
        /// mistake, caught when the layer is built.
        #[track_caller]
        pub fn max_key_len(mut self, bytes: usize) -> Self {
            assert!(
                bytes <= $crate::key::MAX_KEY_LEN,
                "max_key_len({bytes}) is above the longest key a store keeps, MAX_KEY_LEN ({})",
                $crate::key::MAX_KEY_LEN,
            );
            self.settings.max_key_len = bytes;
            self
        }

        /// Which deliveries may meet as duplicates: the scope joined to the namespace of every
        /// key (for the version guard: of every entity), as `namespace@scope`. Default:
        /// [`Scope::route`](crate::key::Scope::route), the route the router matched, so that
        /// two routes receiving the same event id never take each other's deliveries for
        /// duplicates, while one route is one scope whatever path reached it. Without a router
        /// that reports its route, name the scope. See [`Scope`](crate::key::Scope).
        pub fn scope(mut self, scope: $crate::key::Scope) -> Self {
            self.settings.scope = scope;
            self
        }

        /// Verifies each delivery's signature before its key is claimed, e.g.
        /// [`verify::stripe(secret)`](crate::verify::stripe); a missing, malformed, wrong or
        /// expired signature is answered 401 problem+json and the store is not touched. The
        /// body is buffered for it, through [`body_limit`](Self::body_limit) and
        /// [`body_timeout`](Self::body_timeout). See the [`verify`](crate::verify) module.
        #[cfg(feature = "verify")]
        #[cfg_attr(docsrs, doc(cfg(feature = "verify")))]
        pub fn verify(mut self, verify: impl $crate::verify::Verify) -> Self {
            self.settings.verify = Some($crate::engine::settings::Verification(
                ::std::sync::Arc::new(verify),
            ));
            self
        }

        /// [`verify`](Self::verify) when `verify` is `Some`; `None` leaves the layer as it
        /// was, so that a route without a check takes unsigned deliveries. For a route whose
        /// secret is optional configuration, as in a demo; a real receiver sets every secret.
        ///
        /// ```
        /// use tower_idempotency::{IdempotencyLayer, key, store::MemoryStore, verify};
        ///
        /// let secret = std::env::var("GITHUB_WEBHOOK_SECRET").ok().filter(|s| !s.is_empty());
        /// let layer = IdempotencyLayer::new(MemoryStore::new())
        ///     .key(key::github())
        ///     .maybe_verify(secret.map(verify::github));
        /// # let _ = layer;
        /// ```
        #[cfg(feature = "verify")]
        #[cfg_attr(docsrs, doc(cfg(feature = "verify")))]
        pub fn maybe_verify(self, verify: Option<impl $crate::verify::Verify>) -> Self {
            match verify {
                Some(verify) => self.verify(verify),
                None => self,
            }
        }

        /// Tracks this layer's deliveries in `drain`, so that a shutdown can stop new claims
        /// and wait for the running ones (see [`Drain`](crate::Drain)). Create the drain
        /// first, keep a clone for the shutdown, and pass it to every layer it should stop
        /// (one per route, say): the handle you keep is the drain the layers use, whatever
        /// order they were built in. A layer given no drain tracks its deliveries in one of
        /// its own, which nothing closes; a second call replaces the first.
        pub fn drain(mut self, drain: &$crate::engine::Drain) -> Self {
            self.settings.drain = drain.clone();
            self
        }
    };
}
pub(crate) use shared_settings;
