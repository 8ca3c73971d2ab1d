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
//! token as in the SQL stores. A duplicate counts its delivery in the hash (an in-memory
//! write, as cheap as the read).
//!
//! Settled keys (`done`, `released`) expire after the store's retention
//! ([`DEFAULT_RETENTION`], 8 days, unless
//! [`with_retention`](RedisStore::with_retention) says otherwise): Redis deletes them itself,
//! no purge task needed. [`purge_completed`](super::Store::purge_completed) still deletes
//! settled keys older than its argument, for a shorter retention now and then. It and
//! [`stuck_claims`](super::Store::stuck_claims) walk every key of the store with `SCAN` (on
//! each master of a cluster) and read each key found: their cost grows with the number of
//! keys kept, like a table scan, and they are maintenance calls, not for the request path.
//!
//! # What a failure can lose
//!
//! Redis acknowledges a write once it is in the server's memory. Its durability is the
//! server's:
//!
//! - **A restart** of a server without persistence loses every claim and done key: events
//!   delivered again afterwards run again. With `appendonly yes` and `appendfsync everysec`
//!   (Redis's usual setting), it loses at most about the last second of writes; `appendfsync
//!   always` loses none, at the cost of a disk flush per write.
//! - **A failover** (a replica promoted because its master died) loses the writes the master
//!   acknowledged but had not sent to that replica yet: a claim (the event then runs again on
//!   its next delivery while the first run may still be going), or a done marker (the next
//!   delivery runs it again). So a failover can run an event twice; it never loses one: a
//!   delivery is acknowledged only after its handler ran.
//! - [`wait_for_replicas(n, timeout)`](RedisStore::wait_for_replicas) narrows that window: each
//!   claim, commit and release then waits (`WAIT`) until `n` replicas have it, and a write
//!   that `n` replicas did not confirm in time is an error (the layer answers 503, or retries
//!   the commit). It costs a round trip to the replicas per write.
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
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::{ConfigError, DEFAULT_RETENTION, StoreError};
use crate::key::IdempotencyKey;

mod claims;
mod scan;
mod scripts;

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
}

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
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(StoreError::backend)?;
        Ok(Self::new(conn))
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
        }
    }

    /// Writes every key under `prefix` instead of [`DEFAULT_PREFIX`]: two stores with
    /// different prefixes share nothing. Letters, digits, `-`, `_`, `.` and `:`, at most 64
    /// bytes (so that the store's `SCAN` pattern matches its keys alone).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Self, ConfigError> {
        let prefix = prefix.into();
        let valid = !prefix.is_empty()
            && prefix.len() <= 64
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
        if !valid {
            return Err(ConfigError::InvalidTableName {
                name: prefix,
                reason: "a Redis key prefix is 1 to 64 letters, digits, `-`, `_`, `.` or `:`",
            });
        }
        self.prefix = prefix.into();
        Ok(self)
    }

    /// How long settled keys (`done`, `released`) live before Redis deletes them. Default:
    /// [`DEFAULT_RETENTION`]. Keep it longer than any sender retries: a delivery after it runs
    /// again.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention.max(Duration::from_millis(1));
        self
    }

    /// After each claim, commit and release, waits until `replicas` replicas have the write
    /// (`WAIT replicas timeout`); a write they did not confirm within `timeout` is an error.
    /// See the module docs for what it narrows.
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// The Redis key of a claim.
    fn key_of(&self, key: &IdempotencyKey) -> String {
        let ns = key.namespace();
        format!("{}:k:{}:{ns}:{}", self.prefix, ns.len(), key.value())
    }

    /// The Redis key of an entity's versions.
    #[allow(dead_code)]
    fn entity_of(&self, entity: &IdempotencyKey) -> String {
        let ns = entity.namespace();
        format!("{}:v:{}:{ns}:{}", self.prefix, ns.len(), entity.value())
    }

    fn retention_ms(&self) -> u64 {
        u64::try_from(self.retention.as_millis()).unwrap_or(u64::MAX)
    }

    /// Waits for the replicas the store was told to wait for, after a write to `key`.
    async fn replicated(&self, key: &str) -> Result<(), StoreError> {
        let Some((replicas, timeout)) = self.replicas else {
            return Ok(());
        };
        let millis = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(millis);
        let reply: redis::RedisResult<Value> = match &self.conn {
            Conn::Single(conn) => wait.query_async(&mut conn.clone()).await,
            Conn::Cluster(conn) => {
                // To the master of the key's slot: the one that took the write.
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let slot = slot_of(key.as_bytes());
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(slot, SlotAddr::Master),
                ));
                conn.clone().route_command(wait, route).await
            }
        };
        let acked: usize = scan::parsed(reply)?;
        if acked < replicas {
            return Err(StoreError::backend(format!(
                "the write reached {acked} of the {replicas} replicas asked for within {timeout:?}"
            )));
        }
        Ok(())
    }
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key, modulo
/// 16384, as Redis Cluster computes it.
fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
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

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_redis_cluster_computes() {
        // `CLUSTER KEYSLOT` of each, on Redis 7.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"123456789"), 0x31C3, "the CRC16 check value");
        assert_eq!(
            slot_of(b"{}foo"),
            slot_of(b"{}foo"),
            "an empty tag hashes the whole key"
        );
    }
}
