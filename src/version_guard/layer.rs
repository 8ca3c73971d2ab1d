use std::sync::Arc;

use tower_layer::Layer;

use super::mode::VersionMode;
use super::version::ExtractVersion;
use crate::engine::mode::{Guarded, HeldHook, Settings, shared_settings};
use crate::key::{ExtractKey, IdempotencyKey};
use crate::store::VersionStore;
use crate::store::{Pending, Stale};

/// The service made by [`VersionGuardLayer`]: begin the entity's
/// version, run the inner service, then commit or release it. See [`Guarded`], the service
/// shell every mode shares.
pub type VersionGuard<S, St, E, V> = Guarded<S, VersionMode<St, E, V>>;

/// Makes an inner service apply each entity's versions in order: a delivery whose version is
/// older than the entity's applied one is answered 200 (`idempotency-outcome: outdated`)
/// without running the handler, and one version of an entity runs at a time. A version equal
/// to the applied one runs (two changes within one second of a timestamp version are not
/// lost), so used alone the layer runs a redelivery of the latest version again: stack
/// [`IdempotencyLayer`](crate::IdempotencyLayer) outside it, and use a finer version where the
/// sender has one (see [equal versions](crate::version_guard#equal-versions)).
///
/// Built with [`VersionGuardLayer::new`], then [`entity`](Self::entity) and
/// [`version`](Self::version), both required (without them the layer does not compile). See
/// the [module documentation](crate::version_guard) for what each delivery gets.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{Stale, key, version_guard::{self, VersionGuardLayer}, store::MemoryStore};
///
/// let layer = VersionGuardLayer::new(MemoryStore::new())
///     .entity(key::json("/data/object/id").namespace("stripe-subscription"))
///     .version(version_guard::version::json("/data/object/updated"))
///     .stale(Stale::reclaim_after(Duration::from_secs(60)));
/// # let _ = layer;
/// ```
#[must_use]
#[derive(Debug, Clone)]
pub struct VersionGuardLayer<St, E = Unset, V = Unset> {
    store: St,
    entity: E,
    version: V,
    settings: Settings,
    stale: Stale,
    on_held: Option<HeldHook>,
}

/// The entity or version extractor of a [`VersionGuardLayer`] that was not set yet. It extracts
/// nothing: the layer is usable only once both are set.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unset;

impl<St> VersionGuardLayer<St> {
    /// A layer that keeps versions in `store`. Set [`entity`](Self::entity) and
    /// [`version`](Self::version) before use.
    ///
    /// Defaults, as for [`IdempotencyLayer`](crate::IdempotencyLayer): commit on 2xx; a pending
    /// version not renewed for 30 seconds is taken over (the layer renews it every 7.5 seconds
    /// while the handler runs); bodies buffered (only for body extractors) up to 1 MiB within
    /// 30 seconds; store calls bounded by 5 seconds; `Retry-After: 5` on the busy 409 and on
    /// 503; a delivery without entity or version rejected with 400.
    ///
    /// Unlike the deduplicating layers, the version guard's default scope is
    /// [`Scope::shared`](crate::key::Scope::shared): an entity is one entity on every route, so
    /// that events about it that arrive on different endpoints (`subscription.updated` on one,
    /// `subscription.deleted` on another) are still applied in order. The entity namespace
    /// already names the kind of entity. Two routes that receive the same events and apply them
    /// to different state each skip only versions older than the newest one applied (the newest
    /// state still arrives at both); give them a [`scope`](Self::scope) each if every version
    /// must reach both.
    pub fn new(store: St) -> Self {
        Self {
            store,
            entity: Unset,
            version: Unset,
            settings: Settings {
                scope: crate::key::Scope::shared(),
                ..Settings::default()
            },
            stale: Stale::default(),
            on_held: None,
        }
    }
}

impl<St, E, V> VersionGuardLayer<St, E, V> {
    /// Finds the entity a delivery is about, e.g.
    /// `key::json("/data/object/id").namespace("stripe-subscription")`. The namespace keeps
    /// entities of different kinds (or senders) with the same id apart.
    pub fn entity<E2: ExtractKey>(self, entity: E2) -> VersionGuardLayer<St, E2, V> {
        VersionGuardLayer {
            store: self.store,
            entity,
            version: self.version,
            settings: self.settings,
            stale: self.stale,
            on_held: self.on_held,
        }
    }

    /// Finds the delivery's version of the entity: the sender's revision or change time, never
    /// the receiver's clock. See [`version`](crate::version_guard::version).
    pub fn version<V2: ExtractVersion>(self, version: V2) -> VersionGuardLayer<St, E, V2> {
        VersionGuardLayer {
            store: self.store,
            entity: self.entity,
            version,
            settings: self.settings,
            stale: self.stale,
            on_held: self.on_held,
        }
    }

    /// What happens to a pending version whose owner stopped renewing it (its process died):
    /// [`Stale::reclaim_after`] (the default, after 30 seconds) lets the next version begin;
    /// [`Stale::hold_after`] answers 409 until a person calls
    /// [`VersionStore::resolve_version`](super::VersionStore::resolve_version).
    pub fn stale(mut self, stale: Stale) -> Self {
        self.stale = stale;
        self
    }

    /// Called when a delivery meets a stale pending version that the hold policy keeps, with
    /// the entity and the pending version's age. A warning is logged either way.
    pub fn on_held<F>(mut self, hook: F) -> Self
    where
        F: Fn(&IdempotencyKey, &Pending) + Send + Sync + 'static,
    {
        self.on_held = Some(HeldHook(Arc::new(hook)));
        self
    }

    shared_settings!();

    /// The store this layer uses.
    pub fn store(&self) -> &St {
        &self.store
    }
}

impl<S, St, E, V> Layer<S> for VersionGuardLayer<St, E, V>
where
    St: VersionStore + Clone,
    E: ExtractKey + Clone,
    V: ExtractVersion + Clone,
{
    type Service = VersionGuard<S, St, E, V>;

    fn layer(&self, inner: S) -> Self::Service {
        Guarded::new(
            inner,
            Arc::new(VersionMode {
                store: self.store.clone(),
                entity: self.entity.clone(),
                version: self.version.clone(),
                settings: self.settings.clone(),
                stale: self.stale,
                on_held: self.on_held.clone(),
            }),
        )
    }
}
