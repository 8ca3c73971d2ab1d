use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tower_layer::Layer;

use crate::key::{self, Auto, ExtractKey, IdempotencyKey, MAX_KEY_LEN};
use crate::service::{Idempotency, Shared};
use crate::store::{Pending, Stale, Store};

/// The default limit on a body buffered to read a key: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// Makes an inner service process each event once: claim the key, run the inner service,
/// commit on success, release on failure.
///
/// Built with [`IdempotencyLayer::new`] and configured with its builder methods; see the
/// [crate documentation](crate) for what each delivery gets.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{IdempotencyLayer, Stale, key, store::MemoryStore};
///
/// // Charges move money: a stale claim waits for a person instead of running twice.
/// let layer = IdempotencyLayer::new(MemoryStore::new())
///     .key(key::stripe())
///     .stale(Stale::hold_after(Duration::from_secs(15 * 60)))
///     .body_limit(256 * 1024);
/// # let _ = layer;
/// ```
pub struct IdempotencyLayer<St, K = Auto> {
    store: St,
    key: K,
    config: Config,
}

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

type HeldHook = Arc<dyn Fn(&IdempotencyKey, &Pending) + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) stale: Stale,
    pub(crate) body_limit: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) store_timeout: Duration,
    pub(crate) commit_when: fn(StatusCode) -> bool,
    pub(crate) missing_key: MissingKey,
    pub(crate) max_key_len: usize,
    pub(crate) on_held: Option<HeldHook>,
}

impl<St> IdempotencyLayer<St> {
    /// A layer that keeps claims in `store` and finds keys with [`key::auto`], which
    /// recognises the common webhook senders by their headers.
    ///
    /// Defaults: commit on 2xx; stale claims reclaimed after 15 minutes; bodies buffered (only
    /// for body keys) up to 1 MiB within 30 seconds; store calls bounded by 5 seconds;
    /// `Retry-After: 5` on the in-flight 409 and on 503; a request without a key rejected
    /// with 400.
    ///
    /// The layer uses tokio's timers: run it on a runtime with time enabled (the default of
    /// `#[tokio::main]`).
    pub fn new(store: St) -> Self {
        Self {
            store,
            key: key::auto(),
            config: Config::defaults(),
        }
    }
}

impl Config {
    /// The defaults documented on [`IdempotencyLayer::new`], shared by the
    /// [order layer](crate::order::OrderLayer).
    pub(crate) fn defaults() -> Self {
        Self {
            stale: Stale::default(),
            body_limit: DEFAULT_BODY_LIMIT,
            body_timeout: Duration::from_secs(30),
            retry_after: Duration::from_secs(5),
            store_timeout: Duration::from_secs(5),
            commit_when: |status| status.is_success(),
            missing_key: MissingKey::Reject,
            max_key_len: MAX_KEY_LEN,
            on_held: None,
        }
    }
}

impl<St, K> IdempotencyLayer<St, K> {
    /// Finds keys with `key` instead, e.g. [`key::stripe()`] or
    /// [`key::header("x-event-id")`](key::header).
    pub fn key<K2: ExtractKey>(self, key: K2) -> IdempotencyLayer<St, K2> {
        IdempotencyLayer {
            store: self.store,
            key,
            config: self.config,
        }
    }

    /// Decides what happens to stale claims: [`Stale::reclaim_after`] (the default, after 15
    /// minutes) or [`Stale::hold_after`].
    pub fn stale(mut self, stale: Stale) -> Self {
        self.config.stale = stale;
        self
    }

    /// The largest body buffered to read a key, in bytes; larger bodies get 413. Only body
    /// extractors buffer. Default: 1 MiB.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.config.body_limit = bytes;
        self
    }

    /// How long a body may take to arrive when a body extractor reads it; slower ones get 408.
    /// Default: 30 seconds.
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        self.config.body_timeout = timeout;
        self
    }

    /// The `Retry-After` sent with the in-flight 409 and with 503 (store failure). Default: 5
    /// seconds. A held claim's 409 has none: only a person can settle it.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.config.retry_after = after;
        self
    }

    /// How long a claim, commit or release may take. A claim past it is answered 503 (and
    /// released when it lands later); a commit past it leaves the claim to turn stale.
    /// Default: 5 seconds.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.config.store_timeout = timeout;
        self
    }

    /// Which inner responses count as success and commit the key; the others release it.
    /// Default: 2xx.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyLayer, store::MemoryStore};
    ///
    /// // This sender treats 2xx and 3xx as delivered.
    /// let layer = IdempotencyLayer::new(MemoryStore::new())
    ///     .commit_when(|status| status.is_success() || status.is_redirection());
    /// # let _ = layer;
    /// ```
    pub fn commit_when(mut self, predicate: fn(StatusCode) -> bool) -> Self {
        self.config.commit_when = predicate;
        self
    }

    /// What to do with requests that carry no key. Default: [`MissingKey::Reject`].
    pub fn missing_key(mut self, policy: MissingKey) -> Self {
        self.config.missing_key = policy;
        self
    }

    /// Rejects key values longer than `bytes` (at most [`MAX_KEY_LEN`], the default).
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.config.max_key_len = bytes.min(MAX_KEY_LEN);
        self
    }

    /// Called when a delivery meets a stale claim that the hold policy keeps: the place to
    /// page a person. A warning is logged either way.
    pub fn on_held<F>(mut self, hook: F) -> Self
    where
        F: Fn(&IdempotencyKey, &Pending) + Send + Sync + 'static,
    {
        self.config.on_held = Some(Arc::new(hook));
        self
    }

    /// The store this layer uses.
    pub fn store(&self) -> &St {
        &self.store
    }

    #[cfg_attr(
        not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn into_parts(self) -> (St, K, Config) {
        (self.store, self.key, self.config)
    }
}

impl<S, St, K> Layer<S> for IdempotencyLayer<St, K>
where
    St: Store + Clone,
    K: ExtractKey + Clone,
{
    type Service = Idempotency<S, St, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(
            inner,
            Arc::new(Shared {
                store: self.store.clone(),
                key: self.key.clone(),
                config: self.config.clone(),
            }),
        )
    }
}

impl<St: Clone, K: Clone> Clone for IdempotencyLayer<St, K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            key: self.key.clone(),
            config: self.config.clone(),
        }
    }
}

impl<St: fmt::Debug, K: fmt::Debug> fmt::Debug for IdempotencyLayer<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("store", &self.store)
            .field("key", &self.key)
            .field("config", &self.config)
            .finish()
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("stale", &self.stale)
            .field("body_limit", &self.body_limit)
            .field("body_timeout", &self.body_timeout)
            .field("retry_after", &self.retry_after)
            .field("store_timeout", &self.store_timeout)
            .field("missing_key", &self.missing_key)
            .field("max_key_len", &self.max_key_len)
            .field("on_held", &self.on_held.is_some())
            .finish_non_exhaustive()
    }
}
