//! The layer of transactional mode and its builder.

use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::TransactionalStore;
use super::mode::TxMode;
use crate::engine::mode::{Guarded, Settings, shared_settings};
use crate::key::{Auto, ExtractKey};

/// The service of transactional mode, made by [`TransactionalLayer`].
/// See [`Guarded`], the service shell every mode shares.
///
/// As in claim-then-commit mode, a handler whose delivery went away runs to its end in a task
/// of its own, and its answer commits or rolls back the transaction.
pub type Transactional<S, St, K = Auto> = Guarded<S, TxMode<St, K>>;

/// The layer of transactional mode.
///
/// Built with [`TransactionalLayer::new`] on a [`TransactionalStore`]; the key and the settings
/// every mode shares are set as on [`IdempotencyLayer`](crate::IdempotencyLayer). There is no
/// stale policy to choose: a delivery that dies rolls back, and leaves nothing to decide.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # {
/// use std::time::Duration;
/// use tower_idempotency::{key, store::SqliteStore, transactional::TransactionalLayer};
///
/// # fn layer(store: SqliteStore) {
/// let layer = TransactionalLayer::new(store)
///     .key(key::stripe())
///     .lock_timeout(Duration::from_secs(2));
/// # let _ = layer;
/// # }
/// # }
/// ```
///
/// Settings that only claim-then-commit has do not exist here, so they cannot be set and
/// silently ignored:
///
/// ```compile_fail
/// use tower_idempotency::{Stale, transactional::{TransactionalLayer, TransactionalStore}};
///
/// fn layer<St: TransactionalStore>(store: St) {
///     // error[E0599]: no method named `stale`: a rollback leaves no stale claim to decide.
///     let _ = TransactionalLayer::new(store).stale(Stale::default());
/// }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct TransactionalLayer<St, K = Auto> {
    store: St,
    key: K,
    settings: Settings,
    lock_timeout: Duration,
}

impl<St: TransactionalStore> TransactionalLayer<St> {
    /// A layer that runs each delivery in one transaction on `store`'s database, finding keys
    /// with [`key::auto`](crate::key::auto).
    ///
    /// Defaults: commit on 2xx; bodies read whole before the transaction begins, up to 1 MiB
    /// within 30 seconds, so that a slow upload never holds a pooled connection; a duplicate
    /// waits up to 5 seconds for the first delivery's transaction; store calls bounded by 5
    /// seconds on top of that; `Retry-After: 5` on 409 and 503; keys scoped by the route the
    /// router matched ([`Scope::route`](crate::key::Scope::route)); no signature verification.
    pub fn new(store: St) -> Self {
        Self {
            store,
            key: crate::key::auto(),
            settings: Settings::default(),
            lock_timeout: Duration::from_secs(5),
        }
    }
}

impl<St, K> TransactionalLayer<St, K> {
    /// Finds keys with `key` instead, e.g. [`key::stripe()`](crate::key::stripe).
    pub fn key<K2: ExtractKey>(self, key: K2) -> TransactionalLayer<St, K2> {
        TransactionalLayer {
            store: self.store,
            key,
            settings: self.settings,
            lock_timeout: self.lock_timeout,
        }
    }

    /// How long a duplicate waits for the first delivery's open transaction before it answers
    /// 409 with `Retry-After`. Default: 5 seconds. On PostgreSQL the bound holds for every lock
    /// wait of the delivery's transaction, the handler's statements included (`SET LOCAL`); on
    /// MySQL, MariaDB and SQLite only for the marker, the handler's statements keeping the
    /// connection's own setting.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    shared_settings!();

    /// The store this layer uses.
    pub fn store(&self) -> &St {
        &self.store
    }
}

impl<S, St, K> Layer<S> for TransactionalLayer<St, K>
where
    St: TransactionalStore,
    K: ExtractKey + Clone,
{
    type Service = Transactional<S, St, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Guarded::new(
            inner,
            Arc::new(TxMode {
                store: self.store.clone(),
                key: self.key.clone(),
                settings: self.settings.clone(),
                lock_timeout: self.lock_timeout,
            }),
        )
    }
}
