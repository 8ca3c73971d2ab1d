#![doc = include_str!("../../docs/redis.md")]

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

use super::tally::Tally;
use super::{ConfigError, DEFAULT_RETENTION, StoreError};
use crate::key::IdempotencyKey;

mod claims;
mod conn;
mod counts;
mod scan;
mod scripts;
#[cfg(test)]
mod tests;
mod versions;

/// The prefix of every key the store writes, unless told otherwise.
pub const DEFAULT_PREFIX: &str = "tower-idempotency";

/// A [`Store`](super::Store) in Redis or Valkey, on one server or on a Redis Cluster. See the
/// [module docs](self).
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    prefix: Arc<str>,
    retention: Duration,
    replicas: Option<(usize, Duration)>,
    /// On one server, where connections of the store's own come from: the writes that wait
    /// for replicas take them, so that a `WAIT` blocks no other call.
    waiting: Option<Arc<Waiting>>,
    /// Deliveries of duplicates, counted here and written in the background.
    tally: Arc<Tally>,
}

/// On one server it connected to itself, where the store's connections of its own for the
/// writes that wait for replicas come from, made when first needed, and whose turn is next.
struct Waiting {
    client: redis::Client,
    conns: tokio::sync::OnceCell<Vec<ConnectionManager>>,
    turn: AtomicUsize,
}

/// Connections of their own for the writes that wait for replicas.
const WAITING_CONNECTIONS: usize = 4;

/// How often the counts of duplicates are written, unless the store says otherwise.
const COUNT_INTERVAL: Duration = Duration::from_secs(1);

/// The longest retention Redis takes (`PEXPIRE` in milliseconds), rounded down to a century.
const MAX_RETENTION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A connection to one server, or to a cluster.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://host:port/db`).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(StoreError::backend)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        let conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(StoreError::backend)?;
        let mut store = Self::new(conn);
        store.waiting = Some(Arc::new(Waiting {
            client,
            conns: tokio::sync::OnceCell::new(),
            turn: AtomicUsize::new(0),
        }));
        Ok(store)
    }

    /// Connects to the Redis Cluster that the nodes at `urls` belong to (one is enough; the
    /// client learns the others).
    pub async fn connect_cluster<I, U>(urls: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        let client = redis::cluster::ClusterClientBuilder::new(urls)
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(5))
            .build()
            .map_err(StoreError::backend)?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(StoreError::backend)?;
        Ok(Self::on_cluster(conn))
    }

    /// A store on a connection made elsewhere.
    pub fn new(conn: ConnectionManager) -> Self {
        Self::with(Conn::Single(conn))
    }

    /// A store on a cluster connection made elsewhere.
    pub fn on_cluster(conn: ClusterConnection) -> Self {
        Self::with(Conn::Cluster(conn))
    }

    fn with(conn: Conn) -> Self {
        Self {
            conn,
            prefix: DEFAULT_PREFIX.into(),
            retention: DEFAULT_RETENTION,
            replicas: None,
            waiting: None,
            tally: Arc::new(counts::tally(COUNT_INTERVAL)),
        }
    }

    /// Writes every key under `prefix` instead of [`DEFAULT_PREFIX`]: two stores with
    /// different prefixes share nothing. Letters, digits, `-`, `_` and `.`, at most 64 bytes:
    /// no `:`, which separates the prefix from the rest of a key, so that no store's `SCAN`
    /// pattern matches another's keys.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Self, ConfigError> {
        let prefix = prefix.into();
        let valid = !prefix.is_empty()
            && prefix.len() <= 64
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid {
            return Err(ConfigError::InvalidTableName {
                name: prefix,
                reason: "a Redis key prefix is 1 to 64 letters, digits, `-`, `_` or `.`",
            });
        }
        self.prefix = prefix.into();
        // Counts kept for the old prefix's keys are not this store's.
        self.tally = Arc::new(self.tally.like());
        Ok(self)
    }

    /// How long settled keys (`done`, `released`) live before Redis deletes them. Default:
    /// [`DEFAULT_RETENTION`]. Keep it longer than any sender retries: a delivery after it runs
    /// again.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention.clamp(Duration::from_millis(1), MAX_RETENTION);
        self
    }

    /// After each claim, commit, release and resolve (and the version guard's), waits until
    /// `replicas` replicas have the write (`WAIT replicas timeout`); a write they did not
    /// confirm within `timeout` is an error, and a claim or version it granted is given back
    /// first. See the module docs for what it narrows.
    ///
    /// On one server the script and its `WAIT` go together on connections of the store's
    /// own (made by [`connect`](Self::connect) when first needed), because a `WAIT` holds up
    /// every later command on its connection. On a cluster, and for a store made with
    /// [`new`](Self::new), they go on the shared connection: there a replica outage slows
    /// every call to the master concerned, up to `timeout` each.
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// The Redis key of a claim.
    fn key_of(&self, key: &IdempotencyKey) -> String {
        claim_key(&self.prefix, key)
    }

    /// The Redis key of an entity's versions.
    fn entity_of(&self, entity: &IdempotencyKey) -> String {
        let ns = entity.namespace();
        format!("{}:v:{}:{ns}:{}", self.prefix, ns.len(), entity.value())
    }

    fn retention_ms(&self) -> u64 {
        u64::try_from(self.retention.as_millis()).unwrap_or(u64::MAX)
    }
}

/// The Redis key of a claim under `prefix`.
fn claim_key(prefix: &str, key: &IdempotencyKey) -> String {
    let ns = key.namespace();
    format!("{prefix}:k:{}:{ns}:{}", ns.len(), key.value())
}

/// A script argument, as the bytes Redis receives.
pub(super) fn arg(value: impl redis::ToRedisArgs) -> Vec<u8> {
    value.to_redis_args().concat()
}

/// `Ok` if the lease held, else [`StoreError::LeaseLost`].
pub(super) fn lease_held(held: bool) -> Result<(), StoreError> {
    if held {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

/// The error of a write the replicas did not confirm in time.
pub(super) fn unreplicated() -> StoreError {
    StoreError::backend("the write was not confirmed by the replicas the store waits for in time")
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field(
                "connection",
                &match self.conn {
                    Conn::Single(_) => "server",
                    Conn::Cluster(_) => "cluster",
                },
            )
            .field("prefix", &self.prefix)
            .field("retention", &self.retention)
            .field("replicas", &self.replicas)
            .finish()
    }
}
