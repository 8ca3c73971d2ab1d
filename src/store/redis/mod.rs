//! [`RedisStore`]: claims in Redis or Valkey, on one server or on a Redis Cluster.
//!
//! ```no_run
//! use tower_idempotency::{IdempotencyLayer, key, store::RedisStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // One server (or a managed primary):
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! // A Redis Cluster, from any of its nodes:
//! let cluster = RedisStore::connect_cluster(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]).await?;
//! let layer = IdempotencyLayer::new(store).key(key::stripe());
//! # let _ = (layer, cluster);
//! # Ok(())
//! # }
//! ```
//!
//! # How it keeps claims
//!
//! Each key is one Redis hash, `<prefix>:k:<namespace length>:<namespace>:<key>` (prefix
//! `tower-idempotency` unless [`with_prefix`](RedisStore::with_prefix) says otherwise).
//! Every step of the store contract (claim, renew, commit, release, resolve) is one server
//! script that reads and writes that one hash: atomic, one round trip, and, touching a single
//! key, always within one slot of a cluster. Scripts take the time from the server (`TIME`),
//! so app instances with skewed clocks agree on which claims are stale; leases are fenced by a
//! token as in the SQL stores.
//!
//! The client sends a command again when the connection it went out on drops before the
//! answer comes, and the first may have run. Each write knows its second run by the fresh
//! token it was given and answers as the first did: a claim sent twice is acquired once, its
//! delivery and run counted once; a resolve or a version's settlement sent twice answers that
//! it settled. For that, an entity's versions discarded where none was ever applied leave a
//! small hash behind, which expires after the retention.
//!
//! # Delivery counts
//!
//! A duplicate (of a done key, or of one in flight or held) is answered by a script that only
//! reads the hash: nothing for the server to log to its append-only file or to send to
//! replicas (with [`wait_for_replicas`](RedisStore::wait_for_replicas), its `WAIT` returns
//! as soon as the replicas have the earlier writes). Its delivery is counted in the process
//! and added to the hash's `deliveries` and `last_seen` by a background task about once a
//! second ([`with_count_interval`](RedisStore::with_count_interval)), one script per key
//! that had duplicates meanwhile, which leaves a key that expired meanwhile
//! absent. A write whose answer is lost (a connection that drops just then) is tried again,
//! and its counts may then be added twice. [`describe`](super::Store::describe) and
//! [`stuck_claims`](super::Store::stuck_claims) on the same store include the counts not
//! written yet; another instance sees them once they are. A crash loses at most the last
//! interval's counts of the instance (never a claim: counts are statistics);
//! [`write_counts`](RedisStore::write_counts) writes them at once, before shutting down say.
//!
//! Settled keys (`done`, `released`) expire after the store's retention
//! ([`DEFAULT_RETENTION`], 7 days, unless
//! [`with_retention`](RedisStore::with_retention) says otherwise): Redis deletes them itself,
//! no purge task needed. [`purge_completed`](super::Store::purge_completed) still deletes
//! settled keys older than its argument, for a shorter retention now and then. It and
//! [`stuck_claims`](super::Store::stuck_claims) walk every key of the store with `SCAN` (on
//! each master of a cluster) and read each key found: their cost grows with the number of
//! keys kept, like a table scan, and they are maintenance calls, not for the request path.
//! A key found on a node is judged by that node's clock, which wrote its times.
//!
//! # What a failure can lose
//!
//! Redis acknowledges a write once it is in the server's memory. Its durability is the
//! server's:
//!
//! - **A restart** loses what the server had not saved. Redis's default persistence is a
//!   snapshot now and then (RDB): a restart loses the writes since the last one, and a server
//!   without persistence loses every claim and done key; events delivered again afterwards run
//!   again. With `appendonly yes` and `appendfsync everysec` it loses at most about the last
//!   second of writes; `appendfsync always` loses none, at the cost of a disk flush per write
//!   (a duplicate writes nothing; its count is added later, once a key and interval).
//! - **Eviction** deletes keys when the server runs out of memory. Every settled key has a
//!   time to live, so the `volatile-*` policies (the default of many managed services) evict
//!   done keys first, and their events run again; the `allkeys-*` policies evict claims in
//!   flight and the version guard's entities too. Run the store's server with
//!   `maxmemory-policy noeviction`: a full server then refuses writes, which the layer answers
//!   503, and nothing is forgotten.
//! - **A failover** (a replica promoted because its master died) loses the writes the master
//!   acknowledged but had not sent to that replica yet: a claim (the event then runs again on
//!   its next delivery while the first run may still be going), or a done marker (the next
//!   delivery runs it again). So a failover can run an event twice; it never loses one: a
//!   delivery is acknowledged only after its handler ran. For the version guard the lost
//!   write is an applied version: an older version delivered after the failover then applies
//!   over a newer one, which ordering was meant to prevent.
//! - [`wait_for_replicas(n, timeout)`](RedisStore::wait_for_replicas) narrows that window: each
//!   claim, commit and release then waits (`WAIT`) until `n` replicas have it, and a write
//!   that `n` replicas did not confirm in time is an error (a claim is given back and the
//!   layer answers 503; a commit is retried). It costs a round trip to the replicas per write.
//!   `WAIT` narrows the window, it does not close it: a replica that has a write may still not
//!   be the one promoted.
//!
//! A Redis that cannot be reached, or a cluster whose slots are moving, answers errors the
//! layer turns into 503 with `Retry-After`; the handler never runs without a claim. The
//! client follows `MOVED` and `ASK` redirections and reconnects by itself.
//!
//! # The client
//!
//! The store talks to Redis through `redis` (redis-rs), the Rust client most used with tokio,
//! with its `tokio-comp`, `connection-manager` (a single connection shared by all tasks,
//! reconnected when it drops) and `cluster-async` features, without TLS.

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
#[cfg(test)]
mod resend_tests;
mod scan;
mod scripts;
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
