//! The maintenance calls that walk every key of the store: `SCAN` on the server, or on each
//! master of a cluster, then a read of each key found.

use std::time::Duration;

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Pipeline, Value};

use super::claims::micros;
use super::scripts::PURGE;
use super::{Conn, RedisStore, arg};
use crate::key::IdempotencyKey;
use crate::store::{StoreError, StuckClaim};

/// Keys asked of `SCAN` per call.
const SCAN_COUNT: usize = 1000;

/// Where a `SCAN` runs: the one server, or a master of the cluster.
#[derive(PartialEq, Eq)]
enum Node {
    Server,
    Master { host: String, port: u16 },
}

impl RedisStore {
    /// The nodes that hold the store's keys: each master, by the address the client knows
    /// it by (`CLUSTER SLOTS`). A slot range without a master is an error, not a partial walk.
    async fn nodes(&self) -> Result<Vec<Node>, StoreError> {
        let Conn::Cluster(conn) = &self.conn else {
            return Ok(vec![Node::Server]);
        };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let ranges: Vec<Vec<Value>> = parsed(conn.clone().route_command(cmd, route).await)?;
        let mut masters: Vec<Node> = Vec::new();
        for range in ranges {
            // `[start, end, [host, port, id, …], replicas…]`
            let master = range
                .get(2)
                .and_then(|m| redis::from_redis_value::<Vec<Value>>(m.clone()).ok())
                .and_then(|m| {
                    let host = redis::from_redis_value::<String>(m.first()?.clone()).ok()?;
                    let port = redis::from_redis_value::<u16>(m.get(1)?.clone()).ok()?;
                    Some((host, port))
                })
                .filter(|(host, port)| !host.is_empty() && *port != 0)
                .ok_or_else(|| {
                    StoreError::backend("a slot range of the cluster has no reachable master")
                })?;
            let node = Node::Master {
                host: master.0,
                port: master.1,
            };
            if !masters.contains(&node) {
                masters.push(node);
            }
        }
        Ok(masters)
    }

    /// One `SCAN` call on `node`: the next cursor, and the store's claim keys it found.
    async fn scan_once(&self, node: &Node, cursor: u64) -> Result<(u64, Vec<String>), StoreError> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(format!("{}:k:*", self.prefix))
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let value: redis::RedisResult<Value> = match (node, &self.conn) {
            (Node::Master { host, port }, Conn::Cluster(conn)) => {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                conn.clone().route_command(scan, route).await
            }
            _ => scan.query_async(&mut self.conn.clone()).await,
        };
        parsed(value)
    }

    /// Runs `pipeline` on `node` (where the keys it reads live).
    async fn on_node(
        &self,
        node: &Node,
        pipeline: Pipeline,
        count: usize,
    ) -> Result<Vec<Value>, StoreError> {
        match (node, &self.conn) {
            (Node::Master { host, port }, Conn::Cluster(conn)) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                conn.clone().route_pipeline(pipeline, 0, count, route).await
            }
            _ => pipeline.query_async(&mut self.conn.clone()).await,
        }
        .map_err(StoreError::backend)
    }

    /// A walk over every claim key of the store, node by node, reading `fields` of each.
    async fn walk(&self, fields: &'static [&'static str]) -> Result<Walk<'_>, StoreError> {
        Ok(Walk {
            store: self,
            nodes: self.nodes().await?,
            at: 0,
            cursor: 0,
            fields,
        })
    }

    pub(super) async fn stuck(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
        let limit = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        let mut stuck: Vec<StuckClaim> = Vec::new();
        // `SCAN` may return a key twice (while the server rehashes, or a slot moves).
        let mut listed = std::collections::HashSet::new();
        const FIELDS: &[&str] = &[
            "state",
            "renewed_at",
            "claimed_at",
            "deliveries",
            "ns",
            "key",
        ];
        let mut walk = self.walk(FIELDS).await?;
        while let Some((now, rows)) = walk.next().await? {
            for (redis_key, row) in rows {
                let text = |i: usize| {
                    row.get(i)
                        .and_then(|v| redis::from_redis_value::<Option<String>>(v.clone()).ok())
                        .flatten()
                };
                let number = |i: usize| text(i).and_then(|t| t.parse::<i64>().ok()).unwrap_or(0);
                if text(0).as_deref() != Some("processing") {
                    continue;
                }
                let idle = (now - number(1)).max(0);
                if idle < limit || !listed.insert(redis_key.clone()) {
                    continue;
                }
                let (Some(ns), Some(value)) = (text(4), text(5)) else {
                    tracing::error!(key = redis_key, "a claim in Redis names no key; left out");
                    continue;
                };
                match IdempotencyKey::new(ns.clone(), value.clone()) {
                    Ok(key) => {
                        let deliveries =
                            u64::try_from(number(3)).unwrap_or(0) + self.tally.unwritten(&key);
                        stuck.push(StuckClaim::new(
                            key,
                            micros(now - number(2)),
                            micros(idle),
                            deliveries,
                        ));
                    }
                    Err(error) => tracing::error!(
                        key = redis_key,
                        namespace = ns,
                        value,
                        %error,
                        "a claim in Redis is no valid key; left out"
                    ),
                }
            }
        }
        stuck.sort_by(|a, b| {
            b.since_renewal
                .cmp(&a.since_renewal)
                .then_with(|| a.key.namespace().cmp(b.key.namespace()))
                .then_with(|| a.key.value().cmp(b.key.value()))
        });
        Ok(stuck)
    }

    pub(super) async fn purge(&self, older_than: Duration) -> Result<u64, StoreError> {
        let older_than = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        let mut purged = 0;
        let mut walk = self.walk(&["state", "completed_at"]).await?;
        while let Some((now, rows)) = walk.next().await? {
            let before = now.saturating_sub(older_than);
            for (redis_key, row) in rows {
                let text = |i: usize| {
                    row.get(i)
                        .and_then(|v| redis::from_redis_value::<Option<String>>(v.clone()).ok())
                        .flatten()
                };
                let settled = matches!(text(0).as_deref(), Some("done" | "released"));
                let at = text(1).and_then(|t| t.parse::<i64>().ok());
                if !settled || at.is_none_or(|at| at > before) {
                    continue;
                }
                // Checked again in the script: the key may have been claimed since.
                let deleted: u64 = self.call(&PURGE, &redis_key, &[arg(before)]).await?;
                purged += deleted;
            }
        }
        Ok(purged)
    }
}

/// The clock of a node (µs), and keys of it with the fields read.
type Batch = (i64, Vec<(String, Vec<Value>)>);

/// Where a walk over the store's keys is.
struct Walk<'s> {
    store: &'s RedisStore,
    nodes: Vec<Node>,
    /// The node being scanned, and its cursor.
    at: usize,
    cursor: u64,
    fields: &'static [&'static str],
}

impl Walk<'_> {
    /// The next batch of claim keys with their fields, and the clock of the node that holds
    /// them; `None` once every node was walked.
    async fn next(&mut self) -> Result<Option<Batch>, StoreError> {
        while let Some(node) = self.nodes.get(self.at) {
            let (next, keys) = self.store.scan_once(node, self.cursor).await?;
            if next == 0 {
                self.at += 1;
            }
            self.cursor = next;
            if keys.is_empty() {
                continue;
            }
            // The node's own clock with its keys: it wrote their times.
            let mut pipeline = redis::pipe();
            pipeline.cmd("TIME");
            for key in &keys {
                pipeline.cmd("HMGET").arg(key).arg(self.fields);
            }
            let mut rows = self
                .store
                .on_node(node, pipeline, keys.len() + 1)
                .await?
                .into_iter();
            let (seconds, micros): (i64, i64) = parsed(Ok(rows.next().unwrap_or(Value::Nil)))?;
            let rows =
                rows.map(|row| redis::from_redis_value::<Vec<Value>>(row).unwrap_or_default());
            let batch = keys.into_iter().zip(rows).collect();
            return Ok(Some((seconds * 1_000_000 + micros, batch)));
        }
        Ok(None)
    }
}

/// A reply read as `T`.
pub(super) fn parsed<T: redis::FromRedisValue>(
    reply: redis::RedisResult<Value>,
) -> Result<T, StoreError> {
    redis::from_redis_value(reply.map_err(StoreError::backend)?).map_err(StoreError::backend)
}
