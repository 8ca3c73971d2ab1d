use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tower_layer::Layer;

use super::service::{Order, OrderShared};
use super::store::VersionStore;
use super::version::ExtractVersion;
use crate::key::{ExtractKey, IdempotencyKey, MAX_KEY_LEN};
use crate::layer::{Config, MissingKey};
use crate::store::{Pending, Stale};

/// Makes an inner service apply each entity's versions in order: a delivery whose version is
/// not newer than the entity's applied one is answered 200 (`idempotency-outcome: outdated`)
/// without running the handler, and one version of an entity runs at a time.
///
/// Built with [`OrderLayer::new`], then [`entity`](Self::entity) and
/// [`version`](Self::version), both required (without them the layer does not compile). See
/// the [module documentation](crate::order) for what each delivery gets.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{Stale, key, order::{self, OrderLayer}, store::MemoryStore};
///
/// let layer = OrderLayer::new(MemoryStore::new())
///     .entity(key::json("/data/object/id").namespace("stripe-subscription"))
///     .version(order::version::json("/data/object/updated"))
///     .stale(Stale::reclaim_after(Duration::from_secs(5 * 60)));
/// # let _ = layer;
/// ```
pub struct OrderLayer<St, E = Unset, V = Unset> {
    store: St,
    entity: E,
    version: V,
    config: Config,
}

/// The entity or version extractor of an [`OrderLayer`] that was not set yet. It extracts
/// nothing: the layer is usable only once both are set.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unset;

impl<St> OrderLayer<St> {
    /// A layer that keeps versions in `store`. Set [`entity`](Self::entity) and
    /// [`version`](Self::version) before use.
    ///
    /// Defaults, as for [`IdempotencyLayer`](crate::IdempotencyLayer): commit on 2xx; a pending
    /// version older than 15 minutes is taken over; bodies buffered (only for body extractors)
    /// up to 1 MiB within 30 seconds; store calls bounded by 5 seconds; `Retry-After: 5` on the
    /// busy 409 and on 503; a delivery without entity or version rejected with 400.
    pub fn new(store: St) -> Self {
        Self {
            store,
            entity: Unset,
            version: Unset,
            config: Config::defaults(),
        }
    }
}

impl<St, E, V> OrderLayer<St, E, V> {
    /// Finds the entity a delivery is about, e.g.
    /// `key::json("/data/object/id").namespace("stripe-subscription")`. The namespace keeps
    /// entities of different kinds (or senders) with the same id apart.
    pub fn entity<E2: ExtractKey>(self, entity: E2) -> OrderLayer<St, E2, V> {
        OrderLayer {
            store: self.store,
            entity,
            version: self.version,
            config: self.config,
        }
    }

    /// Finds the delivery's version of the entity: the sender's revision or change time, never
    /// the receiver's clock. See [`version`](crate::order::version).
    pub fn version<V2: ExtractVersion>(self, version: V2) -> OrderLayer<St, E, V2> {
        OrderLayer {
            store: self.store,
            entity: self.entity,
            version,
            config: self.config,
        }
    }

    /// What happens to a pending version whose delivery never finished (its process died):
    /// [`Stale::reclaim_after`] (the default, after 15 minutes) lets the next version begin;
    /// [`Stale::hold_after`] answers 409 until a person calls
    /// [`VersionStore::resolve_version`].
    pub fn stale(mut self, stale: Stale) -> Self {
        self.config.stale = stale;
        self
    }

    /// The largest body buffered to read the entity or version, in bytes; larger bodies get
    /// 413. Only body extractors buffer. Default: 1 MiB.
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

    /// The `Retry-After` sent with the busy 409 and with 503. Default: 5 seconds.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.config.retry_after = after;
        self
    }

    /// How long a version claim, commit or release may take. Default: 5 seconds.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.config.store_timeout = timeout;
        self
    }

    /// Which inner responses count as success and apply the version; the others release it.
    /// Default: 2xx.
    pub fn commit_when(mut self, predicate: fn(StatusCode) -> bool) -> Self {
        self.config.commit_when = predicate;
        self
    }

    /// What to do with deliveries that carry no entity id or no version (a `ping` event, say):
    /// [`MissingKey::Reject`] (400, the default) or [`MissingKey::PassThrough`] (run the
    /// handler unordered). Ids and versions that are present but invalid are always rejected.
    pub fn missing(mut self, policy: MissingKey) -> Self {
        self.config.missing_key = policy;
        self
    }

    /// Rejects entity ids longer than `bytes` (at most [`MAX_KEY_LEN`], the default).
    pub fn max_entity_len(mut self, bytes: usize) -> Self {
        self.config.max_key_len = bytes.min(MAX_KEY_LEN);
        self
    }

    /// Called when a delivery meets a stale pending version that the hold policy keeps, with
    /// the entity and the pending version's age. A warning is logged either way.
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
}

impl<S, St, E, V> Layer<S> for OrderLayer<St, E, V>
where
    St: VersionStore + Clone,
    E: ExtractKey + Clone,
    V: ExtractVersion + Clone,
{
    type Service = Order<S, St, E, V>;

    fn layer(&self, inner: S) -> Self::Service {
        Order::new(
            inner,
            Arc::new(OrderShared {
                store: self.store.clone(),
                entity: self.entity.clone(),
                version: self.version.clone(),
                config: self.config.clone(),
            }),
        )
    }
}

impl<St: Clone, E: Clone, V: Clone> Clone for OrderLayer<St, E, V> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            entity: self.entity.clone(),
            version: self.version.clone(),
            config: self.config.clone(),
        }
    }
}

impl<St: fmt::Debug, E: fmt::Debug, V: fmt::Debug> fmt::Debug for OrderLayer<St, E, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrderLayer")
            .field("store", &self.store)
            .field("entity", &self.entity)
            .field("version", &self.version)
            .field("config", &self.config)
            .finish()
    }
}
