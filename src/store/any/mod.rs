//! Choosing the store at run time: [`AnyStore`], one type for every backend the crate was
//! built with, connected from a URL.
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::convert::Infallible;
//!
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::store::{AnyStore, KeyState, Store};
//! use tower_idempotency::{IdempotencyKey, IdempotencyLayer, key};
//!
//! // The URL would come from the configuration (`DATABASE_URL`, say): the scheme picks the store.
//! let store = AnyStore::connect("sqlite::memory:").await?;
//! store.migrate().await?;
//! assert!(matches!(store, AnyStore::Sqlite(_)));
//! assert_eq!(store.backend(), "sqlite");
//!
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(store.clone()).key(key::github()))
//!     .service(service_fn(|_req| async { Ok::<_, Infallible>(Response::new(String::new())) }));
//! let delivery = || Request::post("/hook").header("x-github-delivery", "d-1").body(String::new());
//! svc.clone().oneshot(delivery()?).await?;
//! let again = svc.oneshot(delivery()?).await?;
//! assert_eq!(again.headers()["idempotency-outcome"], "duplicate");
//!
//! let stored = IdempotencyKey::new("github", "d-1")?; // no router, so no scope
//! let record = store.describe(&stored).await?.expect("the key is known");
//! assert_eq!((record.state, record.deliveries, record.runs), (KeyState::Done, 2, 1));
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```
//!
//! # URLs
//!
//! | scheme | store | feature | how [`AnyStore::connect`] opens it |
//! |---|---|---|---|
//! | `postgres://`, `postgresql://` | `PostgresStore` | `postgres` | one connection to check the server, then sqlx's default pool (up to 10 connections) |
//! | `mysql://`, `mariadb://` | `MySqlStore` | `mysql` | the same; `mariadb://` is passed on as `mysql://` |
//! | `sqlite:` | `SqliteStore` | `sqlite` | a file as `SqliteStore::open` opens it (created if missing, WAL, durable commits, a 30 s busy timeout, a pool of 4, its writes queued with the process's other stores on the file), not migrated; `sqlite::memory:`: one connection kept open |
//! | `memory:` | `MemoryStore` | `memory` | a new, empty store; the rest of the URL is ignored |
//! | `redis://`, `valkey://`, `redis+unix://`, `valkey+unix://` | `RedisStore` | `redis` | `RedisStore::connect` with the URL as written: one server, one multiplexed connection that reconnects by itself |
//! | `redis+cluster://`, `valkey+cluster://` | `RedisStore` | `redis` | `RedisStore::connect_cluster` on a Redis Cluster, from the nodes the URL lists (see below) |
//!
//! A cluster URL lists some of the cluster's nodes, comma-separated, after one optional
//! `user:password@` that applies to each:
//! `redis+cluster://user:password@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379`. Each node is
//! then connected as `redis://user:password@host:port`, followed by the URL's `?` query if it
//! has one; one reachable node is enough, the client learns the others. The crate is built
//! without TLS: `rediss://` and `valkeys://` are Redis URLs that fail to connect with the
//! client's own error saying so.
//!
//! Schemes are case-insensitive. A scheme the crate does not know, or one whose feature was
//! not enabled, is a [`ConnectError`] that names the scheme (and the feature), never the
//! whole URL, which may hold a password. For other pool settings, build the store yourself and
//! convert it: every store is `Into<AnyStore>`.
//!
//! # What the enum cannot do
//!
//! `AnyStore` implements [`Store`](crate::store::Store) and [`VersionStore`](crate::store::VersionStore), so it serves
//! [`IdempotencyLayer`](crate::IdempotencyLayer) and the version guard's
//! [`VersionGuardLayer`](crate::version_guard::VersionGuardLayer). It does not implement
//! `TransactionalStore`: that trait names one database (its `Database` type), and a
//! transactional handler's `Tx<DB>` is typed with it at compile time. Take the concrete store
//! out of the variant for those routes, as the [`AnyStore`] docs show.
#![cfg_attr(
    docsrs,
    doc(cfg(any(
        feature = "memory",
        feature = "postgres",
        feature = "sqlite",
        feature = "mysql",
        feature = "redis"
    )))
)]

use super::{ConfigError, StoreError};

#[cfg(feature = "memory")]
use super::MemoryStore;
#[cfg(feature = "mysql")]
use super::MySqlStore;
#[cfg(feature = "postgres")]
use super::PostgresStore;
#[cfg(feature = "redis")]
use super::RedisStore;
#[cfg(feature = "sqlite")]
use super::SqliteStore;

/// `match $store { Variant($s) => $body, .. }` for each variant built: the delegation of
/// every trait method below, written once. With `redis => $none`, Redis answers `$none`
/// instead (it holds no inbox).
macro_rules! each {
    ($store:expr, $s:ident => $body:expr $(, redis => $none:expr)?) => {
        match $store {
            #[cfg(feature = "memory")]
            AnyStore::Memory($s) => $body,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($s) => $body,
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($s) => $body,
            #[cfg(feature = "mysql")]
            AnyStore::MySql($s) => $body,
            #[cfg(feature = "redis")]
            AnyStore::Redis($s) => each!(@redis $s, $body $(, $none)?),
        }
    };
    (@redis $s:ident, $body:expr) => {
        $body
    };
    (@redis $s:ident, $body:expr, $none:expr) => {{
        let _ = $s;
        $none
    }};
}

mod claims;
mod connect;
mod inbox;
mod versions;

use connect::Backend;
pub use connect::ConnectError;

/// One of the stores this crate was built with, chosen at run time (from a URL with
/// [`connect`](Self::connect), or converted from a store with `into()`).
///
/// Every [`Store`](crate::store::Store) and [`VersionStore`](crate::store::VersionStore) method is the chosen store's own. Cloning is cheap:
/// each store's clones share its pool (or map). The enum is `#[non_exhaustive]`, and its
/// variants follow the crate's features, which any crate in the build may turn on: a `match`
/// on it needs a `_` arm.
///
/// # Transactional routes
///
/// `AnyStore` is no `TransactionalStore`: a transactional handler's `Tx<DB>` names its
/// database at compile time, so one type cannot stand for several. Build such routes with a
/// function generic over the store, and call it with the store taken out of the variant:
///
/// ```
/// # #[cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql", feature = "axum"))]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use axum::Router;
/// use axum::routing::{MethodRouter, post};
/// use tower_idempotency::store::AnyStore;
/// use tower_idempotency::transactional::{TransactionalLayer, TransactionalStore, Tx};
/// use tower_idempotency::{IdempotencyLayer, key};
///
/// /// Marks the order paid in the marker's transaction, on whichever database that is.
/// async fn paid<DB: sqlx::Database>(_tx: Tx<DB>, _body: String) -> &'static str {
///     // The order's `UPDATE` runs on `&mut *_tx`, in the marker's transaction.
///     "paid"
/// }
///
/// fn stripe_route<S: TransactionalStore>(store: S) -> MethodRouter {
///     post(paid::<S::Database>).layer(TransactionalLayer::new(store).key(key::stripe()))
/// }
///
/// let store = AnyStore::connect("sqlite::memory:").await?;
/// store.migrate().await?;
/// let stripe = match &store {
///     AnyStore::Sqlite(sqlite) => stripe_route(sqlite.clone()),
///     AnyStore::Postgres(postgres) => stripe_route(postgres.clone()),
///     AnyStore::MySql(mysql) => stripe_route(mysql.clone()),
///     // The memory store has no transactions (nor does a store of a later release).
///     _ => return Err("the Stripe route needs a SQL database".into()),
/// };
/// let app: Router = Router::new()
///     .route("/webhooks/stripe", stripe)
///     // Claim-then-commit routes take the `AnyStore` itself.
///     .route(
///         "/webhooks/github",
///         post(|| async { "noted" }).layer(IdempotencyLayer::new(store).key(key::github())),
///     );
/// # let _ = app;
/// # Ok(())
/// # }
/// # #[cfg(not(all(feature = "sqlite", feature = "postgres", feature = "mysql", feature = "axum")))]
/// # fn main() {}
/// ```
///
/// The same holds for [`version_guard::advance`](crate::version_guard), which works inside
/// a transaction of the concrete store.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyStore {
    /// A [`MemoryStore`]: `memory:`.
    #[cfg(feature = "memory")]
    #[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
    Memory(MemoryStore),
    /// A [`SqliteStore`]: `sqlite:`.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(SqliteStore),
    /// A [`PostgresStore`]: `postgres://`, `postgresql://`.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(PostgresStore),
    /// A [`MySqlStore`], on MySQL or MariaDB: `mysql://`, `mariadb://`.
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    MySql(MySqlStore),
    /// A [`RedisStore`], on one server or a Redis Cluster: `redis://`, `redis+cluster://`
    /// (and their `valkey` spellings, `redis+unix://`).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Redis(RedisStore),
}

impl AnyStore {
    /// Uses the table `name` instead of `idempotency_keys`, as the SQL stores'
    /// `with_table_name` (and its rules: `[A-Za-z_][A-Za-z0-9_]*` of at most 49 bytes, on
    /// PostgreSQL optionally `schema.table`). The memory store has no table: it is returned
    /// unchanged. On Redis, `name` is the prefix of every key the store writes, under
    /// `RedisStore::with_prefix`'s rules (every valid table name is one): two
    /// names share nothing there either.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_idempotency::store::AnyStore;
    ///
    /// let store = AnyStore::connect("sqlite::memory:").await?.with_table_name("webhook_claims")?;
    /// store.migrate().await?;
    /// assert!(AnyStore::connect("sqlite::memory:").await?.with_table_name("no-dashes").is_err());
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "sqlite"))]
    /// # fn main() {}
    /// ```
    pub fn with_table_name(self, name: &str) -> Result<Self, ConfigError> {
        Ok(match self {
            #[cfg(feature = "memory")]
            Self::Memory(store) => {
                let _ = name;
                Self::Memory(store)
            }
            #[cfg(feature = "sqlite")]
            Self::Sqlite(store) => Self::Sqlite(store.with_table_name(name)?),
            #[cfg(feature = "postgres")]
            Self::Postgres(store) => Self::Postgres(store.with_table_name(name)?),
            #[cfg(feature = "mysql")]
            Self::MySql(store) => Self::MySql(store.with_table_name(name)?),
            #[cfg(feature = "redis")]
            Self::Redis(store) => Self::Redis(store.with_prefix(name)?),
        })
    }

    /// Creates the chosen store's tables if they do not exist, and upgrades them (the SQL
    /// stores' own `migrate`). Nothing to do for the memory store, nor for Redis.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            #[cfg(feature = "memory")]
            Self::Memory(_) => Ok(()),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(store) => store.migrate().await,
            #[cfg(feature = "postgres")]
            Self::Postgres(store) => store.migrate().await,
            #[cfg(feature = "mysql")]
            Self::MySql(store) => store.migrate().await,
            #[cfg(feature = "redis")]
            Self::Redis(_) => Ok(()),
        }
    }

    /// The chosen backend, named as its feature: `"memory"`, `"sqlite"`, `"postgres"`,
    /// `"mysql"` (MySQL and MariaDB) or `"redis"` (a server or a cluster). For logs.
    pub fn backend(&self) -> &'static str {
        let backend = match self {
            #[cfg(feature = "memory")]
            Self::Memory(_) => Backend::Memory,
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => Backend::Sqlite,
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => Backend::Postgres,
            #[cfg(feature = "mysql")]
            Self::MySql(_) => Backend::MySql,
            #[cfg(feature = "redis")]
            Self::Redis(_) => Backend::Redis,
        };
        backend.feature()
    }
}

#[cfg(feature = "memory")]
impl From<MemoryStore> for AnyStore {
    fn from(store: MemoryStore) -> Self {
        Self::Memory(store)
    }
}

#[cfg(feature = "sqlite")]
impl From<SqliteStore> for AnyStore {
    fn from(store: SqliteStore) -> Self {
        Self::Sqlite(store)
    }
}

#[cfg(feature = "postgres")]
impl From<PostgresStore> for AnyStore {
    fn from(store: PostgresStore) -> Self {
        Self::Postgres(store)
    }
}

#[cfg(feature = "mysql")]
impl From<MySqlStore> for AnyStore {
    fn from(store: MySqlStore) -> Self {
        Self::MySql(store)
    }
}

#[cfg(feature = "redis")]
impl From<RedisStore> for AnyStore {
    fn from(store: RedisStore) -> Self {
        Self::Redis(store)
    }
}
