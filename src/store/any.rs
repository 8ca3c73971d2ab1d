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
//! `AnyStore` implements [`Store`] and [`VersionStore`], so it serves
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

use std::error::Error as StdError;
use std::time::Duration;

use super::{
    Claim, ConfigError, KeyRecord, Lease, Receipt, Resolution, Stale, Store, StoreError,
    StuckClaim, VersionClaim, VersionLease, VersionStore,
};
use crate::key::IdempotencyKey;

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

/// One of the stores this crate was built with, chosen at run time (from a URL with
/// [`connect`](Self::connect), or converted from a store with `into()`).
///
/// Every [`Store`] and [`VersionStore`] method is the chosen store's own. Cloning is cheap:
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

/// `match $store { Variant($s) => $body, .. }` for each variant built: the delegation of
/// every trait method below, written once.
macro_rules! each {
    ($store:expr, $s:ident => $body:expr) => {
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
            AnyStore::Redis($s) => $body,
        }
    };
}

impl AnyStore {
    /// Connects the store that `url`'s scheme names (see the [module docs](self#urls)).
    ///
    /// Connects before it answers, so a database that cannot be reached (or refuses the
    /// login) fails here, at start-up, with the driver's error as the source. It does not
    /// create tables: call [`migrate`](Self::migrate) next.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        let (scheme, backend) = parse(url)?;
        match backend {
            #[cfg(feature = "memory")]
            Backend::Memory => Ok(Self::Memory(MemoryStore::new())),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => connect_sqlite(&driver_url(url, scheme, "sqlite"))
                .await
                .map(Self::Sqlite)
                .map_err(|source| backend.failed(source)),
            #[cfg(feature = "postgres")]
            Backend::Postgres => server_pool(&driver_url(url, scheme, "postgres"))
                .await
                .map(|pool| Self::Postgres(PostgresStore::new(pool)))
                .map_err(|source| backend.failed(source)),
            #[cfg(feature = "mysql")]
            Backend::MySql => server_pool(&driver_url(url, scheme, "mysql"))
                .await
                .map(|pool| Self::MySql(MySqlStore::new(pool)))
                .map_err(|source| backend.failed(source)),
            #[cfg(feature = "redis")]
            Backend::Redis => {
                let url = driver_url(url, scheme, &scheme.to_ascii_lowercase());
                RedisStore::connect(&url)
                    .await
                    .map(Self::Redis)
                    .map_err(|error| backend.failed(driver_error(error)))
            }
            #[cfg(feature = "redis")]
            Backend::RedisCluster => {
                let nodes = cluster_nodes(url).map_err(|source| backend.failed(source))?;
                RedisStore::connect_cluster(nodes)
                    .await
                    .map(Self::Redis)
                    .map_err(|error| backend.failed(driver_error(error)))
            }
            #[allow(unreachable_patterns)] // with every feature on
            _ => Err(ConnectError::FeatureDisabled {
                scheme: scheme.to_owned(),
                feature: backend.feature(),
            }),
        }
    }

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

impl Store for AnyStore {
    async fn claim(&self, key: &IdempotencyKey, stale: Stale) -> Result<Claim, StoreError> {
        each!(self, s => s.claim(key, stale).await)
    }

    async fn renew(&self, lease: &Lease) -> Result<(), StoreError> {
        each!(self, s => s.renew(lease).await)
    }

    async fn commit(&self, lease: &Lease) -> Result<(), StoreError> {
        each!(self, s => s.commit(lease).await)
    }

    async fn commit_with(&self, lease: &Lease, receipt: &Receipt) -> Result<(), StoreError> {
        each!(self, s => s.commit_with(lease, receipt).await)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        each!(self, s => s.release(lease).await)
    }

    async fn give_back(&self, lease: &Lease) -> Result<(), StoreError> {
        each!(self, s => s.give_back(lease).await)
    }

    async fn describe(&self, key: &IdempotencyKey) -> Result<Option<KeyRecord>, StoreError> {
        each!(self, s => s.describe(key).await)
    }

    async fn stuck_claims(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
        each!(self, s => s.stuck_claims(older_than).await)
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        each!(self, s => s.resolve(key, resolution).await)
    }

    async fn purge_completed(&self, older_than: Duration) -> Result<u64, StoreError> {
        each!(self, s => s.purge_completed(older_than).await)
    }
}

impl VersionStore for AnyStore {
    async fn begin_version(
        &self,
        entity: &IdempotencyKey,
        version: i64,
        stale: Stale,
    ) -> Result<VersionClaim, StoreError> {
        each!(self, s => s.begin_version(entity, version, stale).await)
    }

    async fn renew_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        each!(self, s => s.renew_version(lease).await)
    }

    async fn commit_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        each!(self, s => s.commit_version(lease).await)
    }

    async fn release_version(&self, lease: &VersionLease) -> Result<(), StoreError> {
        each!(self, s => s.release_version(lease).await)
    }

    async fn applied_version(&self, entity: &IdempotencyKey) -> Result<Option<i64>, StoreError> {
        each!(self, s => s.applied_version(entity).await)
    }

    async fn resolve_version(
        &self,
        entity: &IdempotencyKey,
        resolution: Resolution,
    ) -> Result<bool, StoreError> {
        each!(self, s => s.resolve_version(entity, resolution).await)
    }
}

/// Why [`AnyStore::connect`] returned no store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL has no scheme this crate knows (`scheme` is empty when it has none at all).
    #[error("{}", unknown_scheme(scheme))]
    UnknownScheme {
        /// The scheme, as written in the URL.
        scheme: String,
    },
    /// The scheme names a store whose feature this build of the crate does not have.
    #[error(
        "the database URL scheme `{scheme}:` needs the `{feature}` feature of tower-idempotency, which is not enabled"
    )]
    FeatureDisabled {
        /// The scheme, as written in the URL.
        scheme: String,
        /// The feature to enable.
        feature: &'static str,
    },
    /// The store's database could not be reached, or its driver rejected the URL.
    #[error("the {backend} store could not connect to its database")]
    Connect {
        /// The store, named as its feature (see [`AnyStore::backend`]).
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
}

/// The schemes [`AnyStore::connect`] knows, for error messages.
const SCHEMES: &str = "postgres://, postgresql://, mysql://, mariadb://, sqlite:, memory:, \
     redis:// or redis+cluster://";

fn unknown_scheme(scheme: &str) -> String {
    if scheme.is_empty() {
        format!("the database URL has no scheme: expected {SCHEMES}")
    } else {
        format!("unknown database URL scheme `{scheme}:`: expected {SCHEMES}")
    }
}

/// The backends a URL can name, whether or not their feature is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Memory,
    Sqlite,
    Postgres,
    MySql,
    /// One Redis server.
    Redis,
    /// A Redis Cluster.
    RedisCluster,
}

impl Backend {
    /// The feature that builds this backend, which is also its name.
    fn feature(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
            Self::Redis | Self::RedisCluster => "redis",
        }
    }

    #[cfg(any(
        feature = "postgres",
        feature = "sqlite",
        feature = "mysql",
        feature = "redis"
    ))]
    fn failed(self, source: impl Into<Box<dyn StdError + Send + Sync>>) -> ConnectError {
        ConnectError::Connect {
            backend: self.feature(),
            source: source.into(),
        }
    }
}

/// The scheme of `url` as written, and the backend it names.
fn parse(url: &str) -> Result<(&str, Backend), ConnectError> {
    let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(ConnectError::UnknownScheme {
            scheme: String::new(),
        });
    }
    let backend = match scheme.to_ascii_lowercase().as_str() {
        "memory" => Backend::Memory,
        "sqlite" => Backend::Sqlite,
        "postgres" | "postgresql" => Backend::Postgres,
        "mysql" | "mariadb" => Backend::MySql,
        "redis" | "rediss" | "valkey" | "valkeys" | "redis+unix" | "valkey+unix" => Backend::Redis,
        "redis+cluster" | "valkey+cluster" => Backend::RedisCluster,
        _ => {
            return Err(ConnectError::UnknownScheme {
                scheme: scheme.to_owned(),
            });
        }
    };
    Ok((scheme, backend))
}

/// `url` with its scheme replaced by `driver`'s: sqlx's MySQL driver wants `mysql://`, its
/// SQLite driver a lowercase `sqlite:`, and redis-rs a lowercase scheme.
#[cfg(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
))]
fn driver_url(url: &str, scheme: &str, driver: &str) -> String {
    format!("{driver}{}", &url[scheme.len()..])
}

/// A pool of sqlx's default settings (up to 10 connections) on the server at `url`, after one
/// connection of its own: a server that refuses the connection or the login fails at once with
/// its cause, where the pool would try again until its acquire timeout (30 s) and then report
/// only the timeout.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn server_pool<DB: sqlx::Database>(url: &str) -> Result<sqlx::Pool<DB>, sqlx::Error> {
    use sqlx::{ConnectOptions as _, Connection as _};

    let options: <DB::Connection as sqlx::Connection>::Options = url.parse()?;
    options.connect().await?.close().await?;
    Ok(sqlx::pool::PoolOptions::new().connect_lazy_with(options))
}

/// The node URLs of a `redis+cluster://[user:password@]host:port,host:port[?query]` URL: each
/// `redis://[user:password@]host:port[?query]`. An error names what is wrong, never the URL.
#[cfg(feature = "redis")]
fn cluster_nodes(url: &str) -> Result<Vec<String>, String> {
    let (_, rest) = url
        .split_once("://")
        .ok_or("a Redis Cluster URL is redis+cluster://host:port,host:port")?;
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, format!("?{query}")),
        None => (rest, String::new()),
    };
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), rest),
    };
    // A trailing `/` (or `/0`, the only database a cluster has) is allowed.
    let hosts = match hosts.split_once('/') {
        Some((hosts, "" | "0")) => hosts,
        Some(_) => return Err("a Redis Cluster has no database but 0".to_owned()),
        None => hosts,
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .map(|host| format!("redis://{userinfo}{host}{query}"))
        .collect();
    if nodes.is_empty() {
        return Err(
            "the Redis Cluster URL names no node: redis+cluster://host:port,host:port".to_owned(),
        );
    }
    Ok(nodes)
}

/// The client's own error out of the store's, as the source of a [`ConnectError`].
#[cfg(feature = "redis")]
fn driver_error(error: StoreError) -> Box<dyn StdError + Send + Sync> {
    match error {
        StoreError::Backend(source) => source,
        other => Box::new(other),
    }
}

/// Opens a SQLite database as the [SQLite store's docs](super::sqlite#connecting) advise: a
/// file as `SqliteStore::open` opens it (created if missing, WAL, `synchronous = FULL`, a busy
/// timeout of 30 s, a small pool), but for the migration; an in-memory database on one
/// connection that the pool never closes (the database lives as long as its connections).
#[cfg(feature = "sqlite")]
async fn connect_sqlite(url: &str) -> Result<SqliteStore, sqlx::Error> {
    use std::str::FromStr as _;

    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

    let options = SqliteConnectOptions::from_str(url)?;
    if !sqlite_in_memory(url) {
        // As `SqliteStore::open` makes it: its writes take turns with every other store of
        // the process on the file.
        return SqliteStore::open_file(super::sqlite::tuned(options)).await;
    }
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await?;
    Ok(SqliteStore::new(pool))
}

/// Whether sqlx opens the SQLite URL `url` as an in-memory database: `sqlite::memory:`,
/// `sqlite://:memory:`, or `mode=memory`.
#[cfg(feature = "sqlite")]
fn sqlite_in_memory(url: &str) -> bool {
    // As sqlx reads the URL (`SqliteConnectOptions::from_str`).
    let rest = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
    database == ":memory:" || params.split('&').any(|param| param == "mode=memory")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_name_backends() {
        for (url, scheme, backend) in [
            ("memory:", "memory", Backend::Memory),
            ("sqlite::memory:", "sqlite", Backend::Sqlite),
            ("sqlite://webhooks.db", "sqlite", Backend::Sqlite),
            ("SQLite:webhooks.db", "SQLite", Backend::Sqlite),
            ("postgres://u@h/db", "postgres", Backend::Postgres),
            ("postgresql://u@h/db", "postgresql", Backend::Postgres),
            ("mysql://root@h/db", "mysql", Backend::MySql),
            ("MariaDB://root@h/db", "MariaDB", Backend::MySql),
            ("redis://127.0.0.1:6379/0", "redis", Backend::Redis),
            ("Valkey://h", "Valkey", Backend::Redis),
            ("rediss://h", "rediss", Backend::Redis),
            ("redis+unix:///run/redis.sock", "redis+unix", Backend::Redis),
            (
                "redis+cluster://h:7001,h:7002",
                "redis+cluster",
                Backend::RedisCluster,
            ),
            (
                "valkey+cluster://h:7001",
                "valkey+cluster",
                Backend::RedisCluster,
            ),
        ] {
            assert_eq!(parse(url).unwrap(), (scheme, backend), "{url}");
        }
    }

    #[test]
    fn unknown_schemes_are_named_and_urls_are_not() {
        let err = parse("mongodb://:hunter2@h").unwrap_err();
        assert!(matches!(&err, ConnectError::UnknownScheme { scheme } if scheme == "mongodb"));
        let message = err.to_string();
        assert!(message.contains("`mongodb:`"), "{message}");
        assert!(message.contains("postgres://"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");

        for url in [
            "",
            "webhooks.db",
            "/var/lib/x.db",
            "1x://h",
            "c:\\x",
            "hunter2@h",
        ] {
            let err = parse(url).unwrap_err();
            if url == "c:\\x" {
                // A drive letter is a scheme as far as URLs go.
                assert!(matches!(&err, ConnectError::UnknownScheme { scheme } if scheme == "c"));
                continue;
            }
            assert!(
                matches!(&err, ConnectError::UnknownScheme { scheme } if scheme.is_empty()),
                "{url}: {err:?}"
            );
            assert!(err.to_string().contains("no scheme"), "{err}");
        }
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn in_memory_sqlite_urls() {
        for url in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://?mode=memory",
            "sqlite:x.db?cache=shared&mode=memory",
        ] {
            assert!(sqlite_in_memory(url), "{url}");
        }
        for url in [
            "sqlite:x.db",
            "sqlite://x.db?mode=rwc",
            "sqlite://memory.db",
        ] {
            assert!(!sqlite_in_memory(url), "{url}");
        }
    }

    #[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
    #[test]
    fn driver_urls() {
        assert_eq!(
            driver_url("MariaDB://root@h:3306/db", "MariaDB", "mysql"),
            "mysql://root@h:3306/db"
        );
        assert_eq!(driver_url("SQLITE:x.db", "SQLITE", "sqlite"), "sqlite:x.db");
    }

    #[cfg(feature = "redis")]
    #[test]
    fn cluster_urls_name_each_node() {
        assert_eq!(
            cluster_nodes("redis+cluster://10.0.0.1:7001,10.0.0.2:7002").unwrap(),
            ["redis://10.0.0.1:7001", "redis://10.0.0.2:7002"]
        );
        assert_eq!(
            cluster_nodes("Redis+Cluster://app:p%40ss@h1:7001, h2:7002/?protocol=resp3").unwrap(),
            [
                "redis://app:p%40ss@h1:7001?protocol=resp3",
                "redis://app:p%40ss@h2:7002?protocol=resp3"
            ]
        );
        assert_eq!(
            cluster_nodes("valkey+cluster://h:7001/0").unwrap(),
            ["redis://h:7001"]
        );
        for url in [
            "redis+cluster://",
            "redis+cluster://:hunter2@",
            "redis+cluster://,",
            "redis+cluster://:hunter2@h:7001/3",
        ] {
            let err = cluster_nodes(url).unwrap_err();
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    /// Each backend whose feature is off: a clear error naming the scheme and the feature.
    #[tokio::test]
    async fn disabled_features_are_named() {
        let urls = [
            (cfg!(feature = "memory"), "memory:", "memory"),
            (cfg!(feature = "sqlite"), "sqlite::memory:", "sqlite"),
            (
                cfg!(feature = "postgres"),
                "postgresql://u@h/db",
                "postgres",
            ),
            (cfg!(feature = "mysql"), "mariadb://u@h/db", "mysql"),
            (cfg!(feature = "redis"), "redis://h:6379", "redis"),
            (
                cfg!(feature = "redis"),
                "redis+cluster://h:7001,h:7002",
                "redis",
            ),
        ];
        for (_, url, feature) in urls.into_iter().filter(|(on, ..)| !on) {
            let err = AnyStore::connect(url).await.unwrap_err();
            let scheme = url.split(':').next().unwrap();
            assert!(
                matches!(&err, ConnectError::FeatureDisabled { scheme: s, feature: f }
                    if s == scheme && *f == feature),
                "{url}: {err:?}"
            );
            let message = err.to_string();
            assert!(message.contains(&format!("`{scheme}:`")), "{message}");
            assert!(
                message.contains(&format!("`{feature}` feature")),
                "{message}"
            );
        }
    }
}
